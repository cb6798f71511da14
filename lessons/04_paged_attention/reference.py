"""Lesson 04 reference: the engine's `gather_context` and its batched decode path.

`paged_decode` builds the metadata of a step with a single decoding sequence and runs
`TorchAttention.forward`, which stores the token's K/V (here: the values already in its slot, so
nothing changes) and takes the batched decode path, GQA included.
"""

from __future__ import annotations

import torch

from nanovllm.models.attention import AttentionMetadata, TorchAttention, gather_context

__all__ = ["gather_kv", "paged_decode"]


def gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: list[int], seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return gather_context(key_cache, value_cache, torch.tensor(block_table), seq_len)


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: list[int],
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    num_heads = query.shape[0]
    last = seq_len - 1
    slot = block_table[last // block_size] * block_size + last % block_size
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([slot]),
        block_tables=torch.tensor([block_table], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens_list=[seq_len],
        query_lens_list=[1],
        query_start_list=[0, 1],
        decode_seq_indices=torch.tensor([0]),
        decode_token_indices=torch.tensor([0]),
        prefill_seq_indices=[],
    )
    # forward() first stores the new token's K/V; give it the ones already in its slot, and
    # private copies of the caches, so the caller's tensors are never written.
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    k = key_cache[slot // block_size, slot % block_size][None].clone()  # [1, kv_heads, head_dim]
    v = value_cache[slot // block_size, slot % block_size][None].clone()
    backend = TorchAttention(num_heads, num_kv_heads, head_dim, scale)
    return backend.forward(query[None], k, v, key_cache, value_cache, meta)[0]
