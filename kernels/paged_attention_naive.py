"""paged_attention_naive: the straightforward decode kernel, to read before `paged_attention.py`.

What it computes (reference: `reference.paged_attention_ref` with one query token per sequence):
each sequence's single new token attends to its whole context in the paged cache::

    out[i, h] = softmax(scale * q[i, h] . K[0..seq_len_i - 1, h // group]) @ V[0..seq_len_i - 1, ...]

How programs map onto the work: one program per (sequence, query head); the grid is
(num_seqs, num_heads). Each program does the softmax the way it is written on paper, in two passes
over the context, BLOCK_N positions at a time:

1. scores: gather K through the block table, s = scale * q . k for every position, write every
   score to a float32 scratch buffer in global memory, and keep the maximum;
2. weighted sum: read the scores back, p = exp(s - max), add up sum(p) and sum(p * v), and divide.

The maximum is subtracted so exp never overflows; the scratch buffer is what makes two passes
possible. Both cost memory traffic: every score is written and read back, and K and V are read in
separate passes. `paged_attention.py` removes both with the online softmax (one pass, scores never
leave the chip) and by serving a whole GQA group from each K/V load, where this kernel reloads the
same K/V once per query head. Decode only: the query must have exactly one token per sequence.

No `tl.dot` here (one query row is too small for it): q . k is an elementwise product and a sum.
"""

from __future__ import annotations

import torch

from nanovllm.kernels import checks, triton_setup

triton_setup.configure()  # decides interpreter vs compiled; must run before `import triton`
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _paged_attention_naive_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    query_ptr,  # [num_seqs, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    scores_ptr,  # [num_seqs, num_heads, max_context] fp32 scratch
    scale,
    num_heads,
    max_context,
    stride_qt,  # query: token and head strides (head_dim is contiguous)
    stride_qh,
    stride_ot,  # out: same
    stride_oh,
    stride_cb,  # caches: block, offset-in-block and head strides
    stride_co,
    stride_ch,
    stride_bt,  # block_tables: row stride
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # the cache's block size
    BLOCK_N: tl.constexpr,  # context positions per loop step
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)

    dims = tl.arange(0, HEAD_DIM)  # [D]
    q = tl.load(query_ptr + seq * stride_qt + head * stride_qh + dims).to(tl.float32)  # [D]
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    scores = scores_ptr + (seq * num_heads + head).to(tl.int64) * max_context  # this row's scratch
    offs_n = tl.arange(0, BLOCK_N)  # [N]

    # Pass 1: every score, written out, and their maximum.
    m = float("-inf")
    for start in range(0, seq_len, BLOCK_N):
        pos = start + offs_n  # [N] context positions
        valid = pos < seq_len  # [N]
        block = tl.load(block_table + pos // BLOCK_SIZE, mask=valid, other=0)  # [N] physical blocks
        slot = block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_co + kv_head * stride_ch
        k = tl.load(key_cache_ptr + slot[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale  # [N]
        s = tl.where(valid, s, float("-inf"))
        tl.store(scores + pos, s, mask=valid)
        m = tl.maximum(m, tl.max(s, 0))

    # On a GPU a program's threads run in parallel: make pass 1's score writes visible to every
    # thread of this program before pass 2 reads them back (a __syncthreads()).
    tl.debug_barrier()

    # Pass 2: the softmax weights and the weighted sum of V.
    denom = 0.0  # sum of exp(s - m)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)  # [D]
    for start in range(0, seq_len, BLOCK_N):
        pos = start + offs_n
        valid = pos < seq_len
        s = tl.load(scores + pos, mask=valid, other=float("-inf"))  # [N]
        p = tl.exp(s - m)  # [N]; exp(-inf) = 0 for positions past the context
        denom += tl.sum(p, 0)
        block = tl.load(block_table + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_co + kv_head * stride_ch
        # Masked V must load as 0: 0 * (stale NaN in the cache) would still be NaN.
        v = tl.load(value_cache_ptr + slot[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        acc += tl.sum(p[:, None] * v.to(tl.float32), 0)  # [D]

    out = acc / denom
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty))


def paged_attention_naive(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]: one new token per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new token
    scale: float,
    *,
    block_n: int = 32,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim], query.dtype
    """Decode attention, two passes with the scores in a scratch buffer (see module doc)."""
    interpreted = triton_setup.is_interpreted()
    _, block_size, num_kv_heads, head_dim = checks.check_kv_cache(key_cache, value_cache)
    checks.check_block_size(block_size)
    checks.check_head_dim(head_dim)
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be 2-D, got shape {tuple(block_tables.shape)}")
    num_seqs, max_blocks_per_seq = block_tables.shape
    if query.dim() != 3 or query.shape[0] != num_seqs or query.shape[2] != head_dim:
        raise ValueError(
            "decode only: query must be [num_seqs, num_heads, head_dim] = "
            f"[{num_seqs}, num_heads, {head_dim}], got {tuple(query.shape)}"
        )
    num_heads = query.shape[1]
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query is {query.dtype} but the cache is {key_cache.dtype}")
    if query.stride(-1) != 1:
        raise ValueError("query must be contiguous along head_dim (stride(-1) == 1)")
    if not checks.is_power_of_two(block_n):
        raise ValueError(f"block_n={block_n} must be a power of two")
    checks.check_int_tensor("block_tables", block_tables, (num_seqs, max_blocks_per_seq))
    checks.check_int_tensor("seq_lens", seq_lens, (num_seqs,))
    checks.check_same_device(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
    )
    checks.check_device_for_mode(query, interpreted)

    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    # Room for every score of the longest possible context (known without reading seq_lens).
    max_context = max_blocks_per_seq * block_size
    scores = torch.empty(
        (num_seqs, num_heads, max_context), dtype=torch.float32, device=query.device
    )
    _paged_attention_naive_kernel[(num_seqs, num_heads)](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        scores,
        float(scale),
        num_heads,
        max_context,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_tables.stride(0),
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
    )
    return out
