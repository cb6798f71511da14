"""Lesson 05 exercise: two Triton kernels, the KV-cache write and paged decode attention.

You write the bodies of the two `@triton.jit` functions; the Python wrappers below them (written
for you) check the inputs and launch one program per token, or per (sequence, query head).

Without a GPU, Triton's interpreter runs the kernels on the CPU (thousands of times slower, and
equal to a GPU's results up to float rounding), so this lesson works on any Linux x86_64 machine. Check with `nanovllm lesson 5 --check`.

To keep the address arithmetic simple, every tensor here is contiguous: the element [i, j, k] of a
tensor shaped [A, B, C] is at offset (i * B + j) * C + k from its pointer.
"""

from __future__ import annotations

import torch

from nanovllm.kernels import triton_setup

triton_setup.configure()  # interpreter on a CPU, compiled on a GPU; must run before `import triton`
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _store_kvcache_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens] int64
    ROW: tl.constexpr,  # num_kv_heads * head_dim: the elements of one token (a power of two)
):
    """Program t copies token t's key and value (ROW elements each) into cache slot
    `slot_mapping[t]`. A slot of -1 marks a padding token: store nothing at all.

    The cache seen as rows of ROW elements has one row per slot, so slot s starts at s * ROW;
    token t's key starts at t * ROW in `key_ptr`.
    """
    raise NotImplementedError("write _store_kvcache_kernel (lesson 05)")


@triton.jit
def _paged_decode_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim], float32
    query_ptr,  # [num_seqs, num_heads, head_dim]: one decode token per sequence
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    seq_lens_ptr,  # [num_seqs] int32
    scale,  # float
    max_blocks,  # int: the row length of block_tables
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # a power of two
    BLOCK_SIZE: tl.constexpr,  # the cache's block size
    BLOCK_N: tl.constexpr,  # context positions per loop step (a power of two)
):
    """Program (seq, head) computes out[seq, head]: attention of that sequence's decode token,
    query head `head`, over positions 0..seq_len-1 of its context, read through its block table.

    - Its KV head is `head // (NUM_HEADS // NUM_KV_HEADS)` (grouped-query attention).
    - Walk the context BLOCK_N positions at a time. Position p lives in physical block
      `block_tables[seq, p // BLOCK_SIZE]` at offset `p % BLOCK_SIZE`, i.e. cache row
      `(block * BLOCK_SIZE + p % BLOCK_SIZE) * NUM_KV_HEADS + kv_head` of HEAD_DIM elements.
      Mask every load with `p < seq_len`: never read past the context.
    - Combine the steps with the online softmax (running max m, running sum l, accumulator acc,
      all float32): for each step's scores s (masked positions: -inf)
          m_new = max(m, max(s));  p = exp(s - m_new);  alpha = exp(m - m_new)
          l = l * alpha + sum(p);  acc = acc * alpha + sum(p[:, None] * v);  m = m_new
      and store acc / l at the end.
    """
    raise NotImplementedError("write _paged_decode_kernel (lesson 05)")


# --- The wrappers: written for you ---------------------------------------------------------


def store_kvcache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], written
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int; -1 = padding
) -> None:
    """Write each token's K and V into its slot of the paged cache, in place."""
    num_tokens, num_kv_heads, head_dim = key.shape
    row = num_kv_heads * head_dim
    if row & (row - 1):
        raise ValueError(f"num_kv_heads * head_dim = {row} must be a power of two here")
    for t in (key, value, key_cache, value_cache):
        if not t.is_contiguous():
            raise ValueError("every tensor must be contiguous")
    if num_tokens == 0:
        return
    _store_kvcache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping.to(torch.int64), ROW=row
    )


def paged_decode(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    block_n: int = 16,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim], query's dtype
    """Decode attention of one token per sequence over its paged context."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    for t in (query, key_cache, value_cache, block_tables):
        if not t.is_contiguous():
            raise ValueError("every tensor must be contiguous")
    out = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    if num_seqs == 0:
        return out.to(query.dtype)
    _paged_decode_kernel[(num_seqs, num_heads)](
        out,
        query,
        key_cache,
        value_cache,
        block_tables.to(torch.int32),
        seq_lens.to(torch.int32),
        float(scale),
        block_tables.shape[1],
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
    )
    return out.to(query.dtype)
