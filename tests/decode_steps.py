"""Hand-built decode steps (attention metadata and all) for tests that run a model directly."""

from __future__ import annotations

import torch

from nanovllm.executor.step_inputs import step_metadata
from nanovllm.models.attention import AttentionMetadata


def decode_step(
    contexts: list[int], first_block: int, block_size: int, num_blocks: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A decode step of len(contexts) requests: request i has contexts[i] tokens after the step,
    in blocks of its own (numbered from `first_block`, wrapping round the cache). Returns
    input_ids, positions and the metadata (`step_metadata`, the engine's plain builder)."""
    tables, blocks = [], first_block
    for context in contexts:
        needed = -(-context // block_size)
        tables.append([(blocks + j) % num_blocks for j in range(needed)])
        blocks += needed
    n = len(contexts)
    positions = [context - 1 for context in contexts]
    positions_t, meta = step_metadata(positions, [1] * n, list(contexts), tables, block_size)
    input_ids = torch.tensor([(7 * i + 3) % 100 for i in range(n)])
    return input_ids, positions_t, meta
