"""The online softmax, one block at a time: what paged attention computes as it walks a block table.

A paged attention kernel never holds a query's whole row of scores. It reads the context one KV
block at a time (the block table's order) and keeps two numbers per head: the largest score seen
so far, `m`, and the sum of `exp(score - m)` over the scores seen so far, `l`. After a block of
scores `s`:

    m_new = max(m, max(s))
    l     = l * exp(m - m_new) + sum(exp(s - m_new))      (the old sum, rescaled to the new max)

(and the output accumulator is rescaled the same way). After the last block, token j's softmax
weight is `exp(s_j - m) / l`: the weights that combine the values. `online_softmax_walk` does
exactly this for one query, in float32, and returns every intermediate a learner wants to see:
each token's score, `m` and `l` after each block, and the final weights. It is plain torch, for
reading and for the visualizer's attention probe (`attention_probe.py`), not for speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OnlineSoftmaxWalk:
    """One query's attention over its context, block by block, for every head."""

    scores: torch.Tensor  # [num_heads, seq_len] float32: q·k * scale of each context token
    running_max: torch.Tensor  # [num_heads, num_blocks]: m after each block
    running_sum: torch.Tensor  # [num_heads, num_blocks]: l after each block (relative to that m)
    weights: torch.Tensor  # [num_heads, seq_len]: exp(score - m) / l after the last block


def online_softmax_walk(
    q: torch.Tensor,  # [num_heads, head_dim]: one query token
    keys: torch.Tensor,  # [seq_len, num_kv_heads, head_dim]: its context, in logical order
    block_size: int,
    scale: float,
) -> OnlineSoftmaxWalk:
    """The scores, the running max and sum after each block of `block_size` keys, and the
    final weights. Query head h reads KV head h // (num_heads // num_kv_heads) (GQA)."""
    num_heads, num_kv_heads = q.shape[0], keys.shape[1]
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if keys.shape[0] < 1:
        raise ValueError("the context is empty: a query attends to at least itself")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    k = keys.float().repeat_interleave(group, dim=1)  # [seq_len, num_heads, head_dim]
    scores = torch.einsum("hd,khd->hk", q.float(), k) * scale  # [num_heads, seq_len]
    m = torch.full((num_heads,), float("-inf"), device=q.device)
    l = torch.zeros(num_heads, device=q.device)  # noqa: E741 - the papers' name for the sum
    maxes, sums = [], []
    for start in range(0, scores.shape[1], block_size):
        s = scores[:, start : start + block_size]  # [num_heads, <= block_size]
        m_new = torch.maximum(m, s.max(dim=1).values)
        l = l * torch.exp(m - m_new) + torch.exp(s - m_new[:, None]).sum(dim=1)  # noqa: E741
        m = m_new
        maxes.append(m)
        sums.append(l)
    weights = torch.exp(scores - m[:, None]) / l[:, None]
    return OnlineSoftmaxWalk(scores, torch.stack(maxes, dim=1), torch.stack(sums, dim=1), weights)
