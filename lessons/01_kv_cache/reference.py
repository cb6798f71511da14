"""Lesson 01 reference: the engine's attention code, seen through a contiguous cache.

A contiguous KV cache is a paged cache with a single block as long as the sequence (lesson 02
makes that precise). So each function here lays its tensors out as that one block and calls the
engine: `store_kv` writes K/V, `gather_context` reads them back, and `TorchAttention.forward`
attends, taking its prefill path (q_len == kv_len), its chunk path (part of the context already
cached) or its batched decode path (q_len == 1), exactly as during a real engine step.
"""

from __future__ import annotations

import torch

from nanovllm.models.attention import (
    AttentionMetadata,
    TorchAttention,
    gather_context,
    store_kv,
)

__all__ = ["attention", "KVCache", "decode_step"]


def _one_block_metadata(q_len: int, kv_len: int) -> AttentionMetadata:
    """The step layout of one sequence whose context is block 0, slots 0..kv_len-1."""
    decode = q_len == 1
    return AttentionMetadata(
        slot_mapping=torch.arange(kv_len - q_len, kv_len),  # the new tokens' slots
        block_tables=torch.zeros(1, 1, dtype=torch.int32),  # [[block 0]]
        seq_lens=torch.tensor([kv_len], dtype=torch.int32),
        query_start_loc=torch.tensor([0, q_len], dtype=torch.int32),
        seq_lens_list=[kv_len],
        query_lens_list=[q_len],
        query_start_list=[0, q_len],
        decode_seq_indices=torch.tensor([0] if decode else [], dtype=torch.int64),
        decode_token_indices=torch.tensor([0] if decode else [], dtype=torch.int64),
        prefill_seq_indices=[] if decode else [0],
    )


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    q_len, num_heads, head_dim = q.shape
    kv_len = k.shape[0]
    # One block holding the whole context: [1, kv_len, num_heads, head_dim].
    key_cache = torch.zeros(1, kv_len, num_heads, head_dim, dtype=k.dtype)
    value_cache = torch.zeros_like(key_cache)
    cached = kv_len - q_len  # positions already in the cache before this "step"
    store_kv(k[:cached], v[:cached], key_cache, value_cache, torch.arange(cached))
    backend = TorchAttention(num_heads, num_heads, head_dim, scale)
    meta = _one_block_metadata(q_len, kv_len)
    return backend.forward(q, k[cached:], v[cached:], key_cache, value_cache, meta)


class KVCache:
    """A growing contiguous cache: one block, written with `store_kv`, read with
    `gather_context`; its capacity doubles when full (amortised O(1) per token)."""

    def __init__(self, num_heads: int, head_dim: int, dtype: torch.dtype = torch.float32) -> None:
        self._key_block = torch.zeros(1, 16, num_heads, head_dim, dtype=dtype)
        self._value_block = torch.zeros_like(self._key_block)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[0]
        capacity = self._key_block.shape[1]
        if self._len + n > capacity:
            new_capacity = max(2 * capacity, self._len + n)
            grown_k = self._key_block.new_zeros(1, new_capacity, *self._key_block.shape[2:])
            grown_v = torch.zeros_like(grown_k)
            grown_k[:, : self._len] = self._key_block[:, : self._len]
            grown_v[:, : self._len] = self._value_block[:, : self._len]
            self._key_block, self._value_block = grown_k, grown_v
        slots = torch.arange(self._len, self._len + n)
        store_kv(k, v, self._key_block, self._value_block, slots)
        self._len += n

    @property
    def keys(self) -> torch.Tensor:
        return self._context()[0]

    @property
    def values(self) -> torch.Tensor:
        return self._context()[1]

    def _context(self) -> tuple[torch.Tensor, torch.Tensor]:
        block_table = torch.zeros(1, dtype=torch.int32)
        return gather_context(self._key_block, self._value_block, block_table, self._len)


def decode_step(
    cache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    cache.append(k, v)
    keys, values = cache.keys, cache.values  # [kv_len, num_heads, head_dim]
    kv_len, num_heads, head_dim = keys.shape
    key_cache = keys.unsqueeze(0).contiguous()  # the cache as one block
    value_cache = values.unsqueeze(0).contiguous()
    backend = TorchAttention(num_heads, num_heads, head_dim, scale)
    # forward() stores k/v at slot kv_len - 1 again (they are already there) and decodes.
    return backend.forward(q, k, v, key_cache, value_cache, _one_block_metadata(1, kv_len))
