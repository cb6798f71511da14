"""Lesson 01 exercise: causal attention, and a KV cache to decode with.

Shapes: a sequence's queries, keys and values are `[num_tokens, num_heads, head_dim]` float
tensors (no batch dimension: one sequence). Check with `nanovllm lesson 1 --check`.
"""

from __future__ import annotations

import torch


def attention(
    q: torch.Tensor,  # [q_len, num_heads, head_dim]
    k: torch.Tensor,  # [kv_len, num_heads, head_dim]
    v: torch.Tensor,  # [kv_len, num_heads, head_dim]
    scale: float,
) -> torch.Tensor:  # [q_len, num_heads, head_dim]
    """Causal attention of the last `q_len` positions over all `kv_len` positions.

    1 <= q_len <= kv_len. Query row i is the token at position p = kv_len - q_len + i; it attends
    to key positions 0..p (never to later ones). For each head h:

        out[i, h] = softmax(scale * (q[i, h] . k[j, h] for j in 0..p)) @ (v[j, h] for j in 0..p)

    (q_len == kv_len is a prefill: the usual lower-triangular mask. q_len == 1 is a decode: one
    query that sees everything.) Compute the softmax in float32 and return q's dtype.
    """
    raise NotImplementedError("write attention (lesson 01)")


class KVCache:
    """One sequence's keys and values for one layer, in a contiguous tensor that grows.

    `keys` and `values` are `[num_cached_tokens, num_heads, head_dim]`.
    """

    def __init__(self, num_heads: int, head_dim: int, dtype: torch.dtype = torch.float32) -> None:
        self.keys = torch.empty(0, num_heads, head_dim, dtype=dtype)
        self.values = torch.empty(0, num_heads, head_dim, dtype=dtype)

    def __len__(self) -> int:
        return self.keys.shape[0]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add `n` new tokens' keys and values (`[n, num_heads, head_dim]` each) at the end.

        Everything cached before stays exactly as it was: a token's K and V never change once
        computed (that is why they can be cached at all).
        """
        raise NotImplementedError("write KVCache.append (lesson 01)")


def decode_step(
    cache: KVCache,
    q: torch.Tensor,  # [1, num_heads, head_dim]: the new token's query
    k: torch.Tensor,  # [1, num_heads, head_dim]: its key
    v: torch.Tensor,  # [1, num_heads, head_dim]: its value
    scale: float,
) -> torch.Tensor:  # [1, num_heads, head_dim]
    """One decode step: store the new token's K/V in `cache`, then attend with its query over
    every cached token, itself included."""
    raise NotImplementedError("write decode_step (lesson 01)")
