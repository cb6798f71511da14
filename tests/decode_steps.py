"""Hand-built decode steps (attention metadata and all) for tests that run a model directly."""

from __future__ import annotations

import torch

from nanovllm.executor.attention import AttentionMetadata


def decode_step(
    contexts: list[int], first_block: int, block_size: int, num_blocks: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A decode step of len(contexts) requests: request i has contexts[i] tokens after the step,
    in blocks of its own (numbered from `first_block`, wrapping round the cache)."""
    tables, slots, blocks = [], [], first_block
    for context in contexts:
        needed = -(-context // block_size)
        table = [(blocks + j) % num_blocks for j in range(needed)]
        blocks += needed
        tables.append(table)
        position = context - 1
        slots.append(table[position // block_size] * block_size + position % block_size)
    width = max(map(len, tables))
    n = len(contexts)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        seq_lens=torch.tensor(contexts, dtype=torch.int32),
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens_list=list(contexts),
        query_lens_list=[1] * n,
        query_start_list=list(range(n + 1)),
        decode_seq_indices=torch.arange(n),
        decode_token_indices=torch.arange(n),
        prefill_seq_indices=[],
    )
    input_ids = torch.tensor([(7 * i + 3) % 100 for i in range(n)])
    return input_ids, torch.tensor(contexts) - 1, meta
