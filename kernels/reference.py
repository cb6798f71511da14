"""Plain-torch references for the KV-cache write and paged attention: the oracles for the kernels.

These are written to be obviously correct, not fast: Python loops over tokens and sequences, the
context gathered through the block table one sequence at a time, an explicit causal mask, and the
softmax in float32. Every Triton kernel in this package is tested against them, and they are tested
once against `torch.nn.functional.scaled_dot_product_attention` on a contiguous layout.

The paged KV cache (one pair per layer):

    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A sequence's context is split into fixed-size blocks; `block_tables[i]` lists the physical blocks
that hold sequence i's tokens in order, so logical position `pos` lives in physical block
`block_tables[i, pos // block_size]` at offset `pos % block_size`. A token's flat *slot* is
`block_id * block_size + offset`.
"""

from __future__ import annotations

import torch


def store_kvcache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int; -1 = padding, skip
) -> None:
    """Write token t's key/value into the cache at slot `slot_mapping[t]` (in place)."""
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:  # a padding token (e.g. a CUDA-graph batch padded up): nothing to store
            continue
        block, offset = divmod(slot, block_size)
        key_cache[block, offset] = key[t]
        value_cache[block, offset] = value[t]


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int
    seq_lens: torch.Tensor,  # [num_seqs] int: context length including this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int: where each sequence's queries start
    scale: float,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query.dtype
    """Causal attention of each sequence's new tokens over its context in the paged cache.

    Query token j of sequence i sits at position `seq_lens[i] - q_len_i + j` and attends to the
    context positions 0 through its own. Decode (q_len 1), prefill (q_len == seq_len) and chunked
    prefill (anything between) are all this one rule.

    With `sliding_window` W a query at position p sees only positions p - W + 1 .. p, and the
    blocks wholly before the first query's window are not read (a sliding layer's block table
    may hold a placeholder there). With `logits_soft_cap` c each scaled score s becomes
    c * tanh(s / c) before the softmax (Gemma 2).
    """
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads  # query heads per kv head (GQA); 1 is plain multi-head
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start

        # Gather the context through the block table: only the blocks the sequence's queries
        # see, from the one that holds the first query's earliest key (0 without a window).
        first_key = 0 if sliding_window is None else max(0, seq_len - q_len - sliding_window + 1)
        first_block, num_blocks = first_key // block_size, -(-seq_len // block_size)
        blocks = block_tables[i, first_block:num_blocks].long()
        first_pos = first_block * block_size  # the position of the gathered context's first slot
        kv_len = seq_len - first_pos
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:kv_len]  # [kv_len, kvh, d]
        v = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:kv_len]  # [kv_len, kvh, d]
        # Query head h reads kv head h // group: repeat each kv head `group` times.
        k = k.repeat_interleave(group, dim=1).float()  # [kv_len, num_heads, d]
        v = v.repeat_interleave(group, dim=1).float()  # [kv_len, num_heads, d]
        q = query[q_start:q_end].float()  # [q_len, num_heads, d]

        scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [num_heads, q_len, kv_len]
        if logits_soft_cap is not None:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)  # [q_len]
        k_pos = torch.arange(first_pos, seq_len, device=query.device)  # [kv_len]
        visible = k_pos[None, :] <= q_pos[:, None]  # [q_len, kv_len]: causal
        if sliding_window is not None:
            visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # [num_heads, q_len, kv_len], float32
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out
