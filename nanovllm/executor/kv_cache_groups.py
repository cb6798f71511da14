"""A hybrid model's step inputs: a block table and a slot mapping for every KV cache group.

A model whose layers keep different KV (full attention beside sliding windows) has several KV
cache groups (`core/kv_cache_interface.py`), and each request one block table per group: the
same token sits in a different block in each. So each group gets its own `AttentionMetadata`,
equal to the step's but for its block tables and slot mapping, and a layer attends with its
group's (`AttentionMetadata.for_layer`, which the runner's `with_layer_groups` makes possible). A step of
a model with one group is left as it is.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.models.attention import AttentionMetadata


def with_kv_cache_groups(
    meta: AttentionMetadata, out: SchedulerOutput, block_size: int
) -> AttentionMetadata:
    """`meta` with every group's metadata (`kv_cache_groups`), built from each scheduled
    request's `block_tables`."""
    num_groups = len(out.scheduled[0].block_tables) if out.scheduled else 0
    if num_groups <= 1:
        return meta
    groups = []
    for g in range(num_groups):
        tables = [s.block_tables[g] for s in out.scheduled]
        max_blocks = max(len(table) for table in tables)
        padded = [list(table) + [0] * (max_blocks - len(table)) for table in tables]
        slots = [
            table[pos // block_size] * block_size + pos % block_size
            for table, seq_len, q_len in zip(tables, meta.seq_lens_list, meta.query_lens_list)
            for pos in range(seq_len - q_len, seq_len)
        ]
        groups.append(
            replace(
                meta,
                slot_mapping=torch.tensor(slots, dtype=torch.int64),  # [num_tokens]
                block_tables=torch.tensor(padded, dtype=torch.int32).view(len(tables), -1),
            )
        )
    return replace(meta, kv_cache_groups=tuple(groups))


def with_layer_groups(
    meta: AttentionMetadata, layer_to_kv_cache_group: tuple[int, ...]
) -> AttentionMetadata:
    """The step's metadata with each layer's KV cache group (no groups: `meta` itself), the
    groups' tensors on the device of the step's own (a runner may have moved only those)."""
    if not meta.kv_cache_groups:
        return meta
    device = meta.slot_mapping.device
    groups = tuple(
        replace(g, **{name: t.to(device) for name, t in g.tensors().items()})
        for g in meta.kv_cache_groups
    )
    return replace(meta, kv_cache_groups=groups, layer_to_kv_cache_group=layer_to_kv_cache_group)
