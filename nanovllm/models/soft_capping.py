"""Logit soft-capping (Gemma 2): each attention score s, after scaling, becomes cap * tanh(s / cap).

The scores stay smooth but bounded to (-cap, cap), so no single key can take all of a query's
attention however large its raw score grows. Torch's fused attention
(`F.scaled_dot_product_attention`) has no such step, so a soft-capped prefill is written out
here: scores, the cap, the mask, the softmax, the values. `TorchAttention` (`attention.py`) calls
these for a layer with `logits_soft_cap` set; the kernels cap inside their own loops.
"""

from __future__ import annotations

import torch


def soft_cap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(scores / cap), element by element."""
    return cap * torch.tanh(scores / cap)


def soft_capped_attention(
    q: torch.Tensor,  # [num_heads, q_len, head_dim]
    k: torch.Tensor,  # [num_kv_heads, kv_len, head_dim]
    v: torch.Tensor,  # [num_kv_heads, kv_len, head_dim]
    visible: torch.Tensor,  # [q_len, kv_len] bool: True = attend
    scale: float,
    cap: float,
) -> torch.Tensor:  # [q_len, num_heads, head_dim]
    """Attention with soft-capped scores, each KV head shared by its group of query heads."""
    num_queries_per_kv = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(num_queries_per_kv, dim=0)
    v = v.repeat_interleave(num_queries_per_kv, dim=0)
    scores = soft_cap(torch.matmul(q, k.transpose(1, 2)).float() * scale, cap)  # [heads, q, kv]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1).to(v.dtype), v).transpose(0, 1)
