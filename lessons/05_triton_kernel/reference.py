"""Lesson 05 reference: the engine's Triton kernels (`nanovllm.kernels`).

`store_kvcache` is the engine's own. The engine's `paged_attention` serves prefill, chunks and
decodes in one kernel; a decode batch is the case `query_start_loc = [0, 1, ..., num_seqs]`
(one query token per sequence).
"""

from __future__ import annotations

import torch

from nanovllm.kernels.paged_attention import paged_attention
from nanovllm.kernels.store_kvcache import store_kvcache

__all__ = ["store_kvcache", "paged_decode"]


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    num_seqs = query.shape[0]
    query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=query.device)
    return paged_attention(
        query,
        key_cache,
        value_cache,
        block_tables.to(torch.int32),
        seq_lens.to(torch.int32),
        query_start_loc,
        scale,
    )
