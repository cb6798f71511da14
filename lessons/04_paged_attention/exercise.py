"""Lesson 04 exercise: paged attention for one decoding sequence, in PyTorch.

The cache of one layer: `key_cache` and `value_cache` are `[num_blocks, block_size, num_kv_heads,
head_dim]`. A sequence's block table is a list of physical block ids (lesson 02). Check with
`nanovllm lesson 4 --check`.
"""

from __future__ import annotations

import torch


def gather_kv(
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: list[int],
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([seq_len, num_kv_heads, head_dim], same)
    """The keys and values of positions 0..seq_len-1 of the sequence, in logical order.

    Position p is in physical block `block_table[p // block_size]` at offset `p % block_size`.
    Read nothing past position seq_len-1: the rest of the last block holds garbage (the stale
    K/V of an earlier owner of the block).
    The block table may be longer than needed.
    """
    raise NotImplementedError("write gather_kv (lesson 04)")


def paged_decode(
    query: torch.Tensor,  # [num_heads, head_dim]: the new token's query
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_table: list[int],
    seq_len: int,  # context length, the new token included (its K/V are already stored)
    scale: float,
) -> torch.Tensor:  # [num_heads, head_dim], query's dtype
    """Attention of one decode token over its whole context in the paged cache.

    Grouped-query attention: with group = num_heads // num_kv_heads, query head h reads KV head
    h // group. For each query head h:

        out[h] = softmax(scale * keys[:, h // group] @ query[h]) @ values[:, h // group]

    over the seq_len gathered positions (no mask needed: a decode token sees its whole context).
    Compute in float32.
    """
    raise NotImplementedError("write paged_decode (lesson 04)")
