"""paged_attention: FlashAttention-style causal attention over a paged KV cache, one kernel for
decode, prefill and chunked prefill, with grouped-query attention (GQA).

What it computes (reference: `reference.paged_attention_ref`): for sequence i with q_len_i new
tokens and seq_lens[i] tokens of context in the cache (the new ones included), query token j sits at
position p = seq_lens[i] - q_len_i + j and attends to context positions 0..p, which it reads from the
paged cache through block_tables[i]::

    out[t, h] = softmax(scale * q[t, h] . K[0..p, h // group]) @ V[0..p, h // group]

Two options of a layer change what a query sees. With a sliding window W it sees only positions
p - W + 1 .. p, and a program starts its walk at the first step that holds a key of its tile's
first query's window, loading nothing before that key: where the window has moved past a block, a
sliding layer's block table may hold a placeholder. With a soft cap c each scaled score s becomes
c * tanh(s / c) before the softmax (Gemma 2). Both are compile-time switches (`SLIDING`,
`SOFT_CAP`): a layer without them runs exactly the code it ran before they existed.

How programs map onto the work: the grid is (num_seqs, query tiles, num_kv_heads * num_splits).
One program takes one *query tile* of one sequence for one kv head: BLOCK_Q consecutive query
tokens times the GROUP query heads that share that kv head, stacked into the BLOCK_M = BLOCK_Q *
GROUP_PADDED rows of one matrix. Stacking the group is what makes GQA cheap: each K/V tile is
loaded once and serves every query head that reads it, and even a decode step (one query token)
has GROUP rows to feed `tl.dot`. The program then walks the context in steps of BLOCK_N positions,
gathering each step's K and V through the block table (position -> physical block -> slot), and
folds it into the output with the *online softmax*:

    m_new = max(m, rowmax(S))            S = scale * Q K^T for this step, masked causally
    P     = exp(S - m_new)
    l     = l * exp(m - m_new) + rowsum(P)
    acc   = acc * exp(m - m_new) + P V
    m     = m_new                        ... and at the end, out = acc / l

so the softmax over the whole context is exact, yet no program ever holds more than one step of
scores (compare `paged_attention_naive.py`, which writes them all out and reads them back).
Running max, sum and accumulator stay in float32 whatever the input dtype.

Split-KV ("flash-decoding"): a decode batch with few sequences gives few programs (num_seqs *
num_kv_heads), too few to fill a GPU, while each program walks a long context. With num_splits > 1
the context steps of a tile are divided among num_splits programs, each writes its unnormalised
partial (acc, m, l) to a float32 scratch buffer, and a second small kernel combines them with the
same rescaling rule. The wrapper turns this on by itself for small decode batches on a GPU.

Block sizes: a context step of BLOCK_N positions is gathered position by position (each position
looks up its own block-table entry), so BLOCK_N is independent of the cache's block size: block
size 1 and block size 256 run the same code. Positions at or past seq_len are masked out of every
load, so the padding at the end of a block table is never read.
"""

from __future__ import annotations

import torch

from nanovllm.kernels import checks, triton_setup

triton_setup.configure()  # decides interpreter vs compiled; must run before `import triton`
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _dot(a, b, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a @ b with a float32 result.

    DOT_FP32 upcasts the operands first. The wrapper sets it only under Triton's CPU interpreter
    with bfloat16 inputs, whose `tl.dot` on bfloat16 returns garbage (NumPy has no bfloat16); on a
    GPU it is always False and bfloat16 goes to the tensor cores. DOT_PRECISION is "ieee" for
    float32 inputs, so a GPU does not silently round them to TF32.
    """
    if DOT_FP32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _tanh(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1), from `tl.exp` (Triton has no tanh of its own): exact
    limits, exp overflowing to inf gives 1 and underflowing to 0 gives -1, never a NaN."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]                    (written unless SPLIT_KV)
    partial_out_ptr,  # [num_splits, num_tokens, num_heads, head_dim] fp32  (written if SPLIT_KV)
    partial_max_ptr,  # [num_splits, num_tokens, num_heads] fp32             (written if SPLIT_KV)
    partial_sum_ptr,  # [num_splits, num_tokens, num_heads] fp32             (written if SPLIT_KV)
    query_ptr,  # [num_tokens, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    scale,  # float: usually 1 / sqrt(head_dim)
    sliding_window,  # int: a query at p sees keys p - sliding_window + 1 .. p (if SLIDING)
    soft_cap,  # float: each scaled score s becomes soft_cap * tanh(s / soft_cap) (if SOFT_CAP)
    num_tokens,
    num_heads,
    num_splits,
    stride_qt,  # query: token and head strides (head_dim is contiguous)
    stride_qh,
    stride_ot,  # out: same
    stride_oh,
    stride_cb,  # caches: block, offset-in-block and head strides
    stride_co,
    stride_ch,
    stride_bt,  # block_tables: row stride
    GROUP: tl.constexpr,  # query heads per kv head
    GROUP_PADDED: tl.constexpr,  # GROUP rounded up to a power of two
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # the cache's block size
    BLOCK_Q: tl.constexpr,  # query tokens per tile
    BLOCK_M: tl.constexpr,  # rows per tile = BLOCK_Q * GROUP_PADDED
    BLOCK_N: tl.constexpr,  # context positions per loop step
    SPLIT_KV: tl.constexpr,  # write partials for the combine kernel instead of the output
    SLIDING: tl.constexpr,  # a sliding-window layer
    SOFT_CAP: tl.constexpr,  # a soft-capped layer
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits

    # --- This sequence's metadata. ---
    seq_len = tl.load(seq_lens_ptr + seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    cached_before = seq_len - q_len  # context positions that precede this step's tokens

    # --- The query tile: row r is query token r // GROUP_PADDED of the tile, head r % GROUP_PADDED
    # of the group. Rows past the sequence's last query token, or past the group (when GROUP is not
    # a power of two), are padding: loaded as zeros, never stored. ---
    rows = tl.arange(0, BLOCK_M)  # [M]
    q_idx = q_tile * BLOCK_Q + rows // GROUP_PADDED  # [M] query token index within the sequence
    head_in_group = rows % GROUP_PADDED  # [M]
    head = kv_head * GROUP + head_in_group  # [M] query head
    row_valid = (q_idx < q_len) & (head_in_group < GROUP)  # [M]
    q_pos = cached_before + q_idx  # [M] the query token's position in the sequence
    token = (q_start + q_idx).to(tl.int64)  # [M] the query token's row in `query` / `out`
    dims = tl.arange(0, HEAD_DIM)  # [D]
    q = tl.load(
        query_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_valid[:, None],
        other=0.0,
    )  # [M, D]

    # --- Which context steps this program walks. The tile's last real query token is the one
    # furthest along, so the tile needs keys 0 .. cached_before + (its last q_idx). A tile past
    # the end of the sequence's queries needs none. With a window, its first query token's
    # window starts at first_key: the steps before the one holding it are skipped. ---
    tile_q_end = tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len)
    num_keys = tl.where(q_tile * BLOCK_Q < q_len, cached_before + tile_q_end, 0)
    num_steps = tl.cdiv(num_keys, BLOCK_N)
    first_step = 0
    if SLIDING:
        first_key = tl.maximum(cached_before + q_tile * BLOCK_Q - sliding_window + 1, 0)
        first_step = tl.minimum(first_key // BLOCK_N, num_steps)
    if SPLIT_KV:  # this program takes one contiguous share of the steps
        steps_per_split = tl.cdiv(num_steps - first_step, num_splits)
        step_begin = first_step + split * steps_per_split
        step_end = tl.minimum(step_begin + steps_per_split, num_steps)
    else:
        step_begin = first_step
        step_end = num_steps

    # --- The online softmax state, float32 whatever the input dtype. ---
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # [M] running max of the scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # [M] running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # [M, D] running sum of exp(.) * V

    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    offs_n = tl.arange(0, BLOCK_N)  # [N]
    for step in range(step_begin, step_end):
        # Gather BLOCK_N context positions: position -> (physical block, offset) -> address.
        k_pos = step * BLOCK_N + offs_n  # [N]
        k_valid = k_pos < seq_len  # [N] never read past the context (nor the table's padding)
        if SLIDING:  # nor before the tile's first window (nor a placeholder the table holds there)
            k_valid &= k_pos >= first_key
        block = tl.load(block_table + k_pos // BLOCK_SIZE, mask=k_valid, other=0)  # [N]
        slot = block.to(tl.int64) * stride_cb + (k_pos % BLOCK_SIZE) * stride_co  # [N]
        slot += kv_head * stride_ch
        # K is loaded already transposed, [D, N], so Q @ K^T is a plain tl.dot.
        k = tl.load(key_cache_ptr + slot[None, :] + dims[:, None], mask=k_valid[None, :], other=0.0)
        # Masked-off V rows must be 0, not whatever the cache holds: 0 * NaN would poison acc.
        v = tl.load(
            value_cache_ptr + slot[:, None] + dims[None, :], mask=k_valid[:, None], other=0.0
        )

        s = _dot(q, k, DOT_FP32, DOT_PRECISION) * scale  # [M, N] fp32
        if SOFT_CAP:
            s = soft_cap * _tanh(s / soft_cap)
        causal = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]  # [M, N]
        if SLIDING:
            causal &= k_pos[None, :] > q_pos[:, None] - sliding_window
        s = tl.where(causal, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))  # [M]
        # A row that has seen no allowed key yet (a split that starts past its causal limit) still
        # has m_new = -inf; exp(-inf - -inf) would be NaN. Subtracting 0 instead keeps its P and
        # its rescale factor at exactly 0, so the row stays empty.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # [M]
        alpha = tl.exp(m_i - m_sub)  # [M] how much the old state shrinks under the new max
        p = tl.exp(s - m_sub[:, None])  # [M, N]
        l_i = l_i * alpha + tl.sum(p, 1)
        # P is rounded to the cache dtype for the second matmul, as FlashAttention does.
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_FP32, DOT_PRECISION)
        m_i = m_new

    if SPLIT_KV:
        # Unnormalised partials at [split, token, head]; the combine kernel finishes the softmax.
        part = (split * num_tokens + token) * num_heads + head  # [M]
        tl.store(partial_max_ptr + part, m_i, mask=row_valid)
        tl.store(partial_sum_ptr + part, l_i, mask=row_valid)
        tl.store(
            partial_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
            acc,
            mask=row_valid[:, None],
        )
    else:
        # Every real row saw its own position, so l_i > 0 there; the guard only spares padding
        # rows a 0 / 0.
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_i[:, None]  # [M, D]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None],
        )


@triton.jit
def _combine_splits_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    partial_out_ptr,  # [num_splits, num_tokens, num_heads, head_dim] fp32
    partial_max_ptr,  # [num_splits, num_tokens, num_heads] fp32
    partial_sum_ptr,  # [num_splits, num_tokens, num_heads] fp32
    num_tokens,
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    SPLITS_PADDED: tl.constexpr,  # num_splits rounded up to a power of two
):
    """One program per (token, query head): merge the splits' partial softmaxes.

    Split s saw max m_s, sum l_s and accumulator acc_s. Rescaled to the global max M they give
    out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s. A split that saw no key has
    m_s = -inf, l_s = 0, acc_s = 0 and weighs exp(-inf) = 0. Every query sees its own position,
    which some split holds, so M is finite.
    """
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PADDED)  # [S]
    valid = splits < num_splits  # [S]
    part = (splits * num_tokens + token) * num_heads + head  # [S]
    split_max = tl.load(partial_max_ptr + part, mask=valid, other=float("-inf"))  # [S]
    split_sum = tl.load(partial_sum_ptr + part, mask=valid, other=0.0)  # [S]
    dims = tl.arange(0, HEAD_DIM)  # [D]
    acc = tl.load(
        partial_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=valid[:, None], other=0.0
    )  # [S, D]

    weight = tl.exp(split_max - tl.max(split_max, 0))  # [S]
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(split_sum * weight, 0)  # [D]
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims,
        out.to(out_ptr.dtype.element_ty),
    )


def check_supported(block_size: int, head_dim: int) -> None:
    """Raise a ValueError naming the value unless these kernels serve this block size and head dim.

    For the engine to call once at start-up, before it builds a cache the kernels cannot read.
    """
    checks.check_block_size(block_size)
    checks.check_head_dim(head_dim)


def _default_num_splits(
    device: torch.device, programs: int, max_context: int, block_n: int, is_decode: bool
) -> int:
    """Split a decode batch's context only when its programs alone cannot fill the GPU."""
    if not is_decode or device.type != "cuda":
        return 1
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = -(-2 * sm_count // programs)  # about two programs per SM
    worthwhile = -(-max_context // (4 * block_n))  # each split keeps >= 4 steps of work
    return max(1, min(wanted, worthwhile, 32))


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32, cumulative query starts
    scale: float,
    *,
    max_query_len: int | None = None,
    num_splits: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query.dtype
    """Causal attention of each sequence's new tokens over its paged context (see module doc).

    Optional knobs, all keyword-only:
      max_query_len: the longest q_len in the batch, if the caller knows it (the scheduler does).
        It sizes the grid; it must not be smaller than the truth. Without it the wrapper uses 1 when
        every sequence has one query token (decode) and an upper bound otherwise, so it never has
        to read the GPU tensors back; surplus query tiles find no work and exit at once.
      num_splits: split-KV factor (None: automatic, see `_default_num_splits`).
      block_m, block_n: tile sizes (powers of two, >= 16), for tests and tuning.
      sliding_window, logits_soft_cap: the layer's window and soft cap, as `TorchAttention`'s
        (None: the whole context, no cap).
    """
    interpreted = triton_setup.is_interpreted()
    _, block_size, num_kv_heads, head_dim = checks.check_kv_cache(key_cache, value_cache)
    checks.check_block_size(block_size)
    checks.check_head_dim(head_dim)
    num_tokens, num_heads, num_seqs, *_ = checks.check_paged_attention_args(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc
    )
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"query dtype {query.dtype} is not supported (float16/bfloat16/float32)")
    if query.stride(-1) != 1:
        raise ValueError("query must be contiguous along head_dim (stride(-1) == 1)")
    checks.check_device_for_mode(query, interpreted)
    checks.check_window_and_soft_cap(sliding_window, logits_soft_cap)

    out = torch.empty_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        # Each sequence has >= 1 query token, so num_tokens == num_seqs means all have exactly 1.
        max_query_len = 1 if num_tokens == num_seqs else num_tokens - num_seqs + 1
    if max_query_len < 1:
        raise ValueError(f"max_query_len must be >= 1, got {max_query_len}")
    is_decode = max_query_len == 1

    # --- Tile sizes. tl.dot wants every dimension >= 16. Decode has one query token per sequence,
    # so its tile is as small as tl.dot allows; prefill tiles are larger to reuse each K/V step
    # across more queries. The interpreter favours large tiles (fewer Python-level steps). ---
    group = num_heads // num_kv_heads
    group_padded = checks.next_power_of_two(group)
    # float32 has no tensor-core path at "ieee" precision: its tl.dot runs on the FMA units and
    # keeps far more of each tile in registers, so it gets smaller tiles.
    fp32 = query.dtype == torch.float32
    if block_n is None:
        if interpreted:
            block_n = 32
        elif fp32:
            block_n = 16
        else:
            block_n = 32 if head_dim > 128 else 64
    if block_m is None:
        if is_decode or interpreted:
            block_m = 16
        elif fp32:
            block_m = 32
        else:
            block_m = 128 if head_dim <= 64 else 64
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if not (checks.is_power_of_two(value) and value >= 16):
            raise ValueError(f"{name}={value} must be a power of two >= 16")
    block_m = max(block_m, group_padded)  # one query token's whole head group fits in a tile
    block_q = block_m // group_padded
    num_q_tiles = -(-max_query_len // block_q)

    programs = num_seqs * num_q_tiles * num_kv_heads
    max_context = block_tables.shape[1] * block_size  # an upper bound that needs no GPU read
    if num_splits is None:
        num_splits = _default_num_splits(query.device, programs, max_context, block_n, is_decode)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    split_kv = num_splits > 1
    if split_kv:
        partial_out = torch.empty(
            (num_splits, num_tokens, num_heads, head_dim), dtype=torch.float32, device=query.device
        )
        partial_max = torch.empty(
            (num_splits, num_tokens, num_heads), dtype=torch.float32, device=query.device
        )
        partial_sum = torch.empty_like(partial_max)
    else:  # unused by the kernel; any tensor will do as the pointer argument
        partial_out = partial_max = partial_sum = out

    grid = (num_seqs, num_q_tiles, num_kv_heads * num_splits)
    _paged_attention_kernel[grid](
        out,
        partial_out,
        partial_max,
        partial_sum,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        float(scale),
        sliding_window or 0,
        float(logits_soft_cap or 0.0),
        num_tokens,
        num_heads,
        num_splits,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        GROUP_PADDED=group_padded,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        SPLIT_KV=split_kv,
        SLIDING=sliding_window is not None,
        SOFT_CAP=logits_soft_cap is not None,
        DOT_FP32=interpreted and query.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=4 if block_m * head_dim <= 64 * 128 else 8,
        num_stages=2,
    )
    if split_kv:
        _combine_splits_kernel[(num_tokens, num_heads)](
            out,
            partial_out,
            partial_max,
            partial_sum,
            num_tokens,
            num_heads,
            num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            SPLITS_PADDED=checks.next_power_of_two(num_splits),
        )
    return out
