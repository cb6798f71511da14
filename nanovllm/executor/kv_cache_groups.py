"""A hybrid model's step inputs: a block table and a slot mapping for every KV cache group.

A model whose layers keep different KV (full attention beside sliding windows) has several KV
cache groups (`core/kv_cache_interface.py`), and each request one block table per group: the
same token sits in a different block in each. So each group gets its own `AttentionMetadata`,
equal to the step's but for its block tables and slot mapping, and a layer attends with its
group's (`AttentionMetadata.for_layer`, which the runner's `with_layer_groups` makes possible). A step of
a model with one group is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.models.attention import AttentionMetadata

# `step_inputs.step_metadata`: (positions, query_lens, seq_lens, block_tables, block_size) ->
# (positions tensor, metadata)
StepMetadata = Callable[
    [list[int], list[int], list[int], Sequence[Sequence[int]], int],
    tuple[torch.Tensor, AttentionMetadata],
]


def with_kv_cache_groups(
    meta: AttentionMetadata, out: SchedulerOutput, block_size: int, step_metadata: StepMetadata
) -> AttentionMetadata:
    """`meta` with every group's metadata (`kv_cache_groups`): each group's block tables and
    slot mapping, built by `step_metadata` (`step_inputs.py`'s, given by the caller, which
    `step_inputs.py` imports this from) from each scheduled request's `block_tables`."""
    num_groups = len(out.scheduled[0].block_tables) if out.scheduled else 0
    if num_groups <= 1:
        return meta
    # Each token's position, as the step's own metadata was built from them.
    positions = [
        pos
        for seq_len, q_len in zip(meta.seq_lens_list, meta.query_lens_list)
        for pos in range(seq_len - q_len, seq_len)
    ]
    groups = []
    for g in range(num_groups):
        tables = [s.block_tables[g] for s in out.scheduled]
        _, group = step_metadata(
            positions, meta.query_lens_list, meta.seq_lens_list, tables, block_size
        )
        groups.append(
            replace(meta, slot_mapping=group.slot_mapping, block_tables=group.block_tables)
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
