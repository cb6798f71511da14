"""A step's inputs, built from scratch: the flat tensors the model and paged attention read.

The scheduler decides "request A: compute 512 tokens starting at 0; request B: 1 token starting
at 37; ...". The model wants no padding and no batch dimension: one flat list of token ids for
all requests, their positions, the cache slot each new token's K/V goes to (`slot_mapping`:
block `block_table[pos // block_size]`, offset `pos % block_size`), and the layout attention
needs (`AttentionMetadata`: block tables, context lengths, where each request's queries start).

Logits are needed only for the rows that produce a token: the last scheduled token of each
request that has caught up with its prompt (and, with speculative decoding, the rows of its
proposed tokens: each one's logits verify the next proposal). A prefill chunk that stops short
of the end of its prompt needs none.

Everything here is rebuilt from Python lists every step. The CPU and GPU backends build the same
tensors from state kept between steps (`nanovllm/backends/input_batch.py`), tested equal to
these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.kv_cache_groups import with_kv_cache_groups
from nanovllm.models.attention import AttentionMetadata

StepInputs = tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]


def step_inputs(out: SchedulerOutput, block_size: int) -> StepInputs:
    """The step's flat tensors, built from scratch: input_ids, positions, attention metadata and
    the rows whose logits are sampled (the last own token of each sampling request, then its
    proposals)."""
    input_ids: list[int] = []
    positions: list[int] = []
    seq_lens: list[int] = []
    query_lens: list[int] = []
    logits_rows: list[int] = []
    for s in out.scheduled:
        start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
        input_ids.extend(s.token_ids())
        positions.extend(range(start, end))
        seq_lens.append(end)
        query_lens.append(s.num_new_tokens)
        if s.samples:  # the last rows: its last own token's, then any tokens to verify
            logits_rows.extend(range(len(input_ids) - s.num_logits_rows, len(input_ids)))

    block_tables = [s.block_table for s in out.scheduled]
    positions_t, meta = step_metadata(positions, query_lens, seq_lens, block_tables, block_size)
    meta = with_kv_cache_groups(meta, out, block_size, step_metadata)  # (a hybrid model's)
    input_ids_t = torch.tensor(input_ids, dtype=torch.int64)
    return input_ids_t, positions_t, meta, logits_rows


def step_metadata(
    positions: list[int],
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
) -> tuple[torch.Tensor, AttentionMetadata]:
    """The positions tensor and the attention metadata of a flat batch, on the CPU.

    Sequence i computes `query_lens[i]` new tokens at `positions` (flat, sequence after
    sequence) and has `seq_lens[i]` tokens of context after the step, in the blocks of
    `block_tables[i]`. (The draft model of speculative decoding builds its steps with this too.)
    """
    max_blocks = max(len(table) for table in block_tables)
    flat_tables = [
        b for table in block_tables for b in list(table) + [0] * (max_blocks - len(table))
    ]
    # [num_seqs, max_blocks], padded with block 0 (never read past seq_lens)
    block_tables_t = torch.tensor(flat_tables, dtype=torch.int32).view(len(block_tables), -1)
    positions_t = torch.tensor(positions, dtype=torch.int64)  # [num_tokens]
    # Each token's slot through its request's block table. (In plain Python: a step is mostly
    # decodes, one token each, where a few list operations cost less than tensor indexing.)
    slots: list[int] = []
    query_starts = [0]
    for table, n in zip(block_tables, query_lens):
        start = query_starts[-1]
        slots.extend(
            table[pos // block_size] * block_size + pos % block_size
            for pos in positions[start : start + n]
        )
        query_starts.append(start + n)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)  # [num_tokens]

    decode_seqs = [i for i, n in enumerate(query_lens) if n == 1]
    meta = AttentionMetadata(
        slot_mapping=slot_mapping,
        block_tables=block_tables_t,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(query_starts, dtype=torch.int32),
        seq_lens_list=seq_lens,
        query_lens_list=query_lens,
        query_start_list=query_starts,
        decode_seq_indices=torch.tensor(decode_seqs, dtype=torch.int64),
        decode_token_indices=torch.tensor(
            [query_starts[i] for i in decode_seqs], dtype=torch.int64
        ),
        prefill_seq_indices=[i for i, n in enumerate(query_lens) if n > 1],
    )
    return positions_t, meta
