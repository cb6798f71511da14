"""The CPU paged-attention kernel: an online softmax that reads K/V in place, compiled by numba.

What it computes is `reference.paged_attention_ref`: query token j of sequence i sits at position
`seq_lens[i] - q_len_i + j` and attends causally to context positions 0 .. that position, which
live in the physical blocks `block_tables[i]` lists. A sliding-window layer (`sliding_window` W)
sees only the W positions up to its own: each query's walk starts at the first block of its
tile's first token's window, and never reads a slot before the query's window (a sliding layer's
block table may hold a placeholder where the window has moved past a block). A soft-capped layer
(Gemma 2) turns each scaled score s into cap * tanh(s / cap) before the softmax. Both are None
when off, and numba compiles a version of the kernel for each combination of None and a value,
with the code for an option that is None left out: a layer without them runs the code it ran
before they existed (same bits, same speed: kernels/README.md). The torch path of the engine
gathers a padded copy of every context first (`key_cache[block_tables]`) and then reads the copy
again; this kernel walks the block table and reads each block where it lies, once, folding it
into the output with the *online softmax* (as `paged_attention.py` does on a GPU):

    m_new = max(m, max_t s_t)                        s_t = scale * q . k_t, for this block's keys
    l     = l * exp(m - m_new) + sum_t exp(s_t - m_new)
    acc   = acc * exp(m - m_new) + sum_t exp(s_t - m_new) * v_t
    m     = m_new                                    ... and at the end, out = acc / l

so it never holds more than one block of scores, and never looks at a slot past a query's own
position (hence never past seq_len: a stale or NaN slot there cannot leak into the output), nor
before its window.
While it computes one block it asks memory for the next one (`prefetch`): the block table sends
it to an address the hardware could not guess.

How the work is split: one *work item* is one *query tile* (up to `q_tile` consecutive query
tokens of one sequence) times `kv_per_item` of the KV heads. Its rows are the tile's tokens times
the query heads those KV heads serve (`group` per KV head, GQA), so each K/V block, once loaded,
serves every row that reads it. With all KV heads in one item (the wrapper's choice whenever
there are enough tiles to keep every thread busy, as in any decode batch of a few requests), an
item reads each block's K and V whole, one contiguous run of memory; with one KV head per item,
it reads every `num_kv_heads`-th run of `head_dim` floats, and the cache lines between belong to
other items, which may run on another thread or much later (kernels/README.md measures the
two). When tiles are few (one request decoding), items of one KV head each give the threads
something to share.
`prange` shares the items among numba's threads; the wrapper has them handed out one at a time
(`numba.set_parallel_chunksize(1)`), because items differ in cost (contexts differ; later tiles of
a causal prefill see more keys) and equal static shares would leave a thread idle.

Per (query row, key) the kernel does three things: a dot product for the score, an exp for its
weight, and the weight times the value. Two of them are written for LLVM to vectorise: the
scores are taken four keys per pass over head_dim (each query element loaded once for the
four), and the exp is `exp_nonpositive`, arithmetic instead of a call to the C library's `expf`
(which runs one value at a time; numba has no vector math library here). Both measured in
kernels/README.md ("Four keys per score pass, and an exp in arithmetic").

Why numba: the kernel is plain Python loops, compiled to machine code by LLVM on the first call
(and cached on disk, `cache=True`), with no C compiler on the user's machine. `fastmath` allows
reassociation (so the dot products vectorise) but not `nnan`/`ninf`: -inf is a real value here.
Everything is float32: the CPU engine's dtype (numba has no bfloat16/float16 arithmetic);
`cpu_paged_attention.py` sends other dtypes to the torch reference.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

# LLVM fast-math flags: reassociate and contract (vectorised dot products, FMA), but keep IEEE
# infinities and NaN (no `nnan`/`ninf`): the running max starts at -inf.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

# Cache lines (bytes) asked for ahead per (query row, key) of the current block: see `attend`.
PREFETCH_BYTES_PER_KEY = 128


@intrinsic
def prefetch(typingctx, address):
    """Ask the CPU to bring the cache line at `address` (an integer) towards it, for a read soon
    (LLVM's `llvm.prefetch`: x86's `prefetcht0`). A hint, never a fault: an address outside the
    cache array would just be ignored (the kernel only asks for block ids `plan` checked)."""

    def codegen(context, builder, signature, args):
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte_ptr], fnty)
        read, keep_in_all_levels, data_cache = (ir.Constant(i32, v) for v in (0, 3, 1))
        ptr = builder.inttoptr(args[0], byte_ptr)
        builder.call(fn, [ptr, read, keep_in_all_levels, data_cache])
        return context.get_dummy_value()

    return types.void(types.intp), codegen


@intrinsic
def float32_from_bits(typingctx, bits):
    """The float32 whose IEEE-754 bits are the int32 `bits` (LLVM's `bitcast`, no arithmetic)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@njit(inline="always", fastmath=_FASTMATH)
def exp_nonpositive(x):
    """exp(x) for a float32 x <= 0, in float32 arithmetic that LLVM vectorises (Cephes' expf).

    exp(x) = 2^n * exp(r), with n = round(x / ln 2) and r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2]
    (ln 2 in two parts, so that r keeps its low bits); exp(r) is a degree-7 polynomial, and 2^n
    is built from its bits: exponent field n + 127, mantissa zero. x is clamped at -87, where
    exp is 1.6e-38, still a normal float32 (n >= -126): a weight that small beside the row's
    largest, which is exp(0) = 1, changes no sum. Within 5 ulp of exp over [-87, 0] (4.5 ulp
    at most on 20M random points, near -87: `fastmath` may fold the two parts of ln 2 back into
    one), where the C library's `expf` is within 1: a relative 5e-7 on a softmax weight, well
    inside the rounding the kernel's reassociated sums already allow
    (tests/kernels/test_kernel_cpu_paged_attention.py).
    """
    x = max(x, np.float32(-87.0))
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    x = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    y = np.float32(1.9875691500e-4)
    y = y * x + np.float32(1.3981999507e-3)
    y = y * x + np.float32(8.3334519073e-3)
    y = y * x + np.float32(4.1665795894e-2)
    y = y * x + np.float32(1.6666665459e-1)
    y = y * x + np.float32(5.0000001201e-1)
    y = y * (x * x) + x + np.float32(1.0)
    return y * float32_from_bits(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))


# Error codes `plan` returns; `paged_attention_numba` turns them into messages (a jitted function
# cannot format one).
OK, BAD_QUERY_START, BAD_SEQ_LEN, TABLE_TOO_SHORT, BAD_BLOCK_ID = 0, 1, 2, 3, 4


@njit(cache=True)
def plan(
    block_tables,
    seq_lens,
    query_start_loc,
    num_tokens,
    block_size,
    num_blocks,
    q_tile,
    sliding_window,
):
    """Check the metadata and list the query tiles: (tile_seq, tile_first, error, bad_seq).

    Serial and cheap (one pass over the block-table entries the batch reads). A bad value would
    otherwise make `attend` read outside the cache, so it is caught here, before any thread starts.
    With a window (`sliding_window` > 0) the entries before the block of the sequence's first
    query's window are not read, so they are not checked: they may hold anything.
    """
    none = np.empty(0, np.int64)
    num_tiles = 0
    for s in range(seq_lens.shape[0]):
        q_start, q_end = query_start_loc[s], query_start_loc[s + 1]
        if q_start < 0 or q_end < q_start or q_end > num_tokens:
            return none, none, BAD_QUERY_START, s
        if seq_lens[s] < q_end - q_start:
            return none, none, BAD_SEQ_LEN, s
        needed = (seq_lens[s] + block_size - 1) // block_size
        if needed > block_tables.shape[1]:
            return none, none, TABLE_TOO_SHORT, s
        first_block = 0
        if sliding_window > 0:  # the first query, at seq_len - q_len, sees the earliest key
            first_key = seq_lens[s] - (q_end - q_start) - sliding_window + 1
            first_block = max(0, first_key) // block_size
        for b in range(first_block, needed):
            if block_tables[s, b] < 0 or block_tables[s, b] >= num_blocks:
                return none, none, BAD_BLOCK_ID, s
        num_tiles += (q_end - q_start + q_tile - 1) // q_tile
    tile_seq = np.empty(num_tiles, np.int64)
    tile_first = np.empty(num_tiles, np.int64)
    tile = 0
    for s in range(seq_lens.shape[0]):
        for first in range(0, query_start_loc[s + 1] - query_start_loc[s], q_tile):
            tile_seq[tile] = s
            tile_first[tile] = first
            tile += 1
    return tile_seq, tile_first, OK, -1


@njit(inline="always", fastmath=_FASTMATH)
def accumulate_values(acc, r, weights, value_cache, block, kv_head, start, end):
    """acc[r] += sum over start <= t < end of weights[t] * value_cache[block, t, kv_head], adding
    the keys in order t = start, start + 1, ... (the same rounding as one key at a time).

    Eight keys per pass over head_dim, then four, then one: each pass loads and stores acc[r]
    once for all its keys, vectorised along head_dim. One key per pass spent most of its time
    loading and storing acc (`kernels/README.md`, "Eight keys per pass").
    """
    head_dim = acc.shape[1]
    t = start
    while t + 8 <= end:
        p0, p1, p2, p3 = weights[t], weights[t + 1], weights[t + 2], weights[t + 3]
        p4, p5, p6, p7 = weights[t + 4], weights[t + 5], weights[t + 6], weights[t + 7]
        for d in range(head_dim):
            x = acc[r, d]
            x += p0 * value_cache[block, t, kv_head, d]
            x += p1 * value_cache[block, t + 1, kv_head, d]
            x += p2 * value_cache[block, t + 2, kv_head, d]
            x += p3 * value_cache[block, t + 3, kv_head, d]
            x += p4 * value_cache[block, t + 4, kv_head, d]
            x += p5 * value_cache[block, t + 5, kv_head, d]
            x += p6 * value_cache[block, t + 6, kv_head, d]
            x += p7 * value_cache[block, t + 7, kv_head, d]
            acc[r, d] = x
        t += 8
    while t + 4 <= end:
        p0, p1, p2, p3 = weights[t], weights[t + 1], weights[t + 2], weights[t + 3]
        for d in range(head_dim):
            x = acc[r, d]
            x += p0 * value_cache[block, t, kv_head, d]
            x += p1 * value_cache[block, t + 1, kv_head, d]
            x += p2 * value_cache[block, t + 2, kv_head, d]
            x += p3 * value_cache[block, t + 3, kv_head, d]
            acc[r, d] = x
        t += 4
    while t < end:
        p = weights[t]
        for d in range(head_dim):
            acc[r, d] += p * value_cache[block, t, kv_head, d]
        t += 1


@njit(parallel=True, cache=True, fastmath=_FASTMATH, nogil=True)
def attend(
    out,  # [num_tokens, num_heads, head_dim] float32, written
    query,  # [num_tokens, num_heads, head_dim] float32
    key_cache,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    value_cache,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    block_tables,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens,  # [num_seqs] int32
    query_start_loc,  # [num_seqs + 1] int32
    tile_seq,  # [num_tiles] int64: the sequence of each query tile (from `plan`)
    tile_first,  # [num_tiles] int64: its first query token, within the sequence
    q_tile,  # query tokens per tile
    kv_per_item,  # KV heads per work item: num_kv_heads, or a divisor of it
    scale,  # float: usually 1 / sqrt(head_dim)
    sliding_window,  # int: a query at p sees keys p - sliding_window + 1 .. p; None: 0 .. p
    soft_cap,  # float: each scaled score s becomes soft_cap * tanh(s / soft_cap); None: no cap
):
    block_size, num_kv_heads, head_dim = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    block_bytes = block_size * num_kv_heads * head_dim * 4  # one block of K (or V), all heads
    key_address, value_address = key_cache.ctypes.data, value_cache.ctypes.data
    group = query.shape[1] // num_kv_heads  # query heads per kv head
    heads = kv_per_item * group  # query heads per item: rows per token
    items_per_tile = num_kv_heads // kv_per_item
    for item in prange(tile_seq.shape[0] * items_per_tile):
        first_head = (item % items_per_tile) * heads
        tile = item // items_per_tile
        seq = tile_seq[tile]
        q_start = query_start_loc[seq]
        q_len = query_start_loc[seq + 1] - q_start
        cached_before = seq_lens[seq] - q_len  # positions that precede this step's tokens
        first = tile_first[tile]
        last = min(first + q_tile, q_len)  # one past the tile's last query token
        # Row r: token first + r // heads, query head first_head + r % heads.
        rows = (last - first) * heads

        # The tile's queries, pre-scaled, and the online-softmax state, all float32.
        q = np.empty((rows, head_dim), np.float32)
        for r in range(rows):
            token = q_start + first + r // heads
            head = first_head + r % heads
            for d in range(head_dim):
                q[r, d] = query[token, head, d] * scale
        m = np.full(rows, -np.inf, np.float32)  # running max of the scores
        l = np.zeros(rows, np.float32)  # running sum of exp(score - m)  # noqa: E741
        acc = np.zeros((rows, head_dim), np.float32)  # running sum of exp(score - m) * v
        scores = np.empty(block_size, np.float32)

        # The tile's last token sees the furthest key: position cached_before + last - 1. Its
        # first token sees the earliest one: position 0, or with a window the first of that
        # token's window. Blocks wholly before it are never read: where a window has moved
        # past a block, a sliding layer's block table may hold a placeholder there.
        num_keys = cached_before + last
        num_key_blocks = (num_keys + block_size - 1) // block_size
        first_key_block = 0
        if sliding_window is not None:
            first_key_block = max(0, cached_before + first - sliding_window + 1) // block_size
        # Prefetch. A decode reads its K and V once, from DRAM, block by block, and the hardware
        # prefetcher does not follow the block table to the next block, at another address: so
        # the kernel asks for it, the first block at once, and each next one while the current
        # one is computed, a few lines per row and key. Prefill tiles, which read each block
        # from the cache many times, ask too: asking in decode tiles only made prefills slower
        # (kernels/README.md, "Prefetch").
        first_block_at = block_tables[seq, first_key_block] * block_bytes
        for line in range(0, block_bytes, 64):
            prefetch(key_address + first_block_at + line)
            prefetch(value_address + first_block_at + line)
        for b in range(first_key_block, num_key_blocks):
            block = block_tables[seq, b]
            block_start = b * block_size  # position of the block's first slot
            prefetch_next = b + 1 < num_key_blocks
            next_at = block_tables[seq, b + 1] * block_bytes if prefetch_next else 0
            prefetch_k, prefetch_v = key_address + next_at, value_address + next_at
            prefetch_end = block_bytes if prefetch_next else 0  # bytes of the next block to ask
            for r in range(rows):
                kv_head = (first_head + r % heads) // group
                q_pos = cached_before + first + r // heads
                # Keys this row may see in this block, slots start .. end - 1: causal, so never
                # past q_pos < seq_len, and with a window never before q_pos - window + 1.
                end = min(block_size, q_pos + 1 - block_start)
                start = 0
                if sliding_window is not None:
                    start = max(0, q_pos - sliding_window + 1 - block_start)
                if end <= start:
                    continue
                m_new = m[r]
                t = start
                while t + 4 <= end:  # four keys per pass: each q[r, d] loaded once for them
                    ahead = (r * block_size + t) * PREFETCH_BYTES_PER_KEY
                    if ahead < prefetch_end:
                        for line in range(ahead, ahead + 4 * PREFETCH_BYTES_PER_KEY, 64):
                            prefetch(prefetch_k + line)
                            prefetch(prefetch_v + line)
                    s0 = s1 = s2 = s3 = np.float32(0.0)
                    for d in range(head_dim):
                        qd = q[r, d]
                        s0 += qd * key_cache[block, t, kv_head, d]
                        s1 += qd * key_cache[block, t + 1, kv_head, d]
                        s2 += qd * key_cache[block, t + 2, kv_head, d]
                        s3 += qd * key_cache[block, t + 3, kv_head, d]
                    scores[t], scores[t + 1], scores[t + 2], scores[t + 3] = s0, s1, s2, s3
                    m_new = max(m_new, max(max(s0, s1), max(s2, s3)))
                    t += 4
                while t < end:  # then one at a time
                    ahead = (r * block_size + t) * PREFETCH_BYTES_PER_KEY
                    if ahead < prefetch_end:
                        for line in range(ahead, ahead + PREFETCH_BYTES_PER_KEY, 64):
                            prefetch(prefetch_k + line)
                            prefetch(prefetch_v + line)
                    s = np.float32(0.0)
                    for d in range(head_dim):
                        s += q[r, d] * key_cache[block, t, kv_head, d]
                    scores[t] = s
                    m_new = max(m_new, s)
                    t += 1
                if soft_cap is not None:  # Gemma 2: cap the scores, and take their max again
                    cap = np.float32(soft_cap)
                    m_new = m[r]
                    for t in range(start, end):
                        s = cap * math.tanh(scores[t] / cap)
                        scores[t] = s
                        m_new = max(m_new, s)
                # m[r] = -inf before the first block: exp(-inf) = 0 empties the old state.
                alpha = math.exp(m[r] - m_new)
                l_new = l[r] * alpha
                for d in range(head_dim):
                    acc[r, d] *= alpha
                # From slot 0, the slots before the window weighing exactly 0 (their scores were
                # never computed): from `start`, LLVM vectorised this loop worse (README).
                for t in range(end):
                    p = exp_nonpositive(scores[t] - m_new)  # (<= 0: m_new is the max)
                    if sliding_window is not None:
                        p = p if t >= start else np.float32(0.0)
                    scores[t] = p  # the score's weight, for the values
                    l_new += p
                accumulate_values(acc, r, scores, value_cache, block, kv_head, start, end)
                m[r] = m_new
                l[r] = l_new

        for r in range(rows):
            token = q_start + first + r // heads
            head = first_head + r % heads
            inv = np.float32(1.0) / l[r]  # every row saw its own position, so l > 0
            for d in range(head_dim):
                out[token, head, d] = acc[r, d] * inv


class AttentionPlan(NamedTuple):
    """What `plan_attention` works out from a step's metadata alone: the same for every layer
    that attends with that metadata (and the same window, cache shape and query heads), so an
    engine can make it once per step (vLLM's CPU backend builds its scheduler metadata once per
    step too, in `CPUAttentionMetadataBuilder.build`)."""

    block_tables: np.ndarray  # [num_seqs, max_blocks_per_seq] int32, contiguous
    seq_lens: np.ndarray  # [num_seqs] int32
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    tile_seq: np.ndarray  # [num_tiles] int64: each query tile's sequence (`plan`)
    tile_first: np.ndarray  # [num_tiles] int64: its first query token, within the sequence
    num_tokens: int  # query tokens the plan covers
    cache_shape: tuple[int, int, int, int]  # (num_blocks, block_size, num_kv_heads, head_dim)
    q_tile: int
    kv_per_item: int
    num_threads: int  # numba threads for `attend`
    sliding_window: int | None
    decode_only: bool  # every sequence has exactly one query token (query_start_loc 0, 1, ..)


def plan_attention(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int
    seq_lens: torch.Tensor,  # [num_seqs] int
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int
    num_tokens: int,
    cache_shape: tuple[int, int, int, int],  # the key cache's
    q_tile: int,
    num_threads: int,
    kv_per_item: int | None = None,
    sliding_window: int | None = None,
) -> AttentionPlan:
    """Check the metadata (`plan`, serial) and decide the work split; a ValueError names the
    first bad value (shapes and dtypes already checked by the caller)."""
    # Fixed argument types (int32 metadata) so that numba compiles one version.
    block_tables, seq_lens, query_start_loc = (
        t.to(torch.int32).contiguous().numpy() for t in (block_tables, seq_lens, query_start_loc)
    )
    num_blocks, block_size, num_kv_heads = cache_shape[0], cache_shape[1], cache_shape[2]
    tile_seq, tile_first, error, seq = plan(
        block_tables,
        seq_lens,
        query_start_loc,
        num_tokens,
        block_size,
        num_blocks,
        q_tile,
        sliding_window or 0,  # plan's "no window"
    )
    if error != OK:
        q_start, q_end = int(query_start_loc[seq]), int(query_start_loc[seq + 1])
        seq_len = int(seq_lens[seq])
        raise ValueError(
            {
                BAD_QUERY_START: f"query_start_loc[{seq}:{seq + 2}] = [{q_start}, {q_end}] is "
                f"not an ascending range inside the {num_tokens} query tokens",
                BAD_SEQ_LEN: f"sequence {seq}: seq_len={seq_len} is shorter than its "
                f"{q_end - q_start} query tokens",
                TABLE_TOO_SHORT: f"sequence {seq}: seq_len={seq_len} needs "
                f"{-(-seq_len // block_size)} blocks but block_tables has "
                f"{block_tables.shape[1]} columns",
                BAD_BLOCK_ID: f"sequence {seq}: block table {block_tables[seq].tolist()} holds "
                f"a block id outside the cache's {num_blocks} blocks",
            }[error]
        )
    num_threads = max(1, min(num_threads, numba.config.NUMBA_NUM_THREADS))
    if kv_per_item is None:
        # All KV heads per item (whole blocks read at once) when the tiles alone give every
        # thread a few items to take; else one KV head per item, for more items to share.
        kv_per_item = num_kv_heads if len(tile_seq) >= 4 * num_threads else 1
    if kv_per_item < 1 or num_kv_heads % kv_per_item:
        raise ValueError(f"kv_per_item={kv_per_item} must divide num_kv_heads={num_kv_heads}")
    return AttentionPlan(
        block_tables,
        seq_lens,
        query_start_loc,
        tile_seq,
        tile_first,
        num_tokens,
        tuple(cache_shape),
        q_tile,
        kv_per_item,
        num_threads,
        sliding_window,
        num_tokens == len(seq_lens)
        and np.array_equal(query_start_loc, np.arange(len(query_start_loc), dtype=np.int32)),
    )


def attend_planned(
    out: np.ndarray,  # [num_tokens, num_heads, head_dim] float32, contiguous: written
    query: np.ndarray,  # [num_tokens, num_heads, head_dim] float32, contiguous
    key_cache: np.ndarray,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    value_cache: np.ndarray,
    plan: AttentionPlan,  # `plan_attention`'s, for this metadata and this cache's shape
    scale: float,
    logits_soft_cap: float | None = None,
) -> None:
    """Run `attend` on numpy views (the caches read where they lie, never copied), with the
    work split `plan` decided."""
    torch_threads = torch.get_num_threads()
    numba.set_num_threads(plan.num_threads)
    # Hand the work items out one at a time, as threads come free: they differ in cost.
    chunksize = numba.set_parallel_chunksize(1)
    try:
        attend(
            out,
            query,
            key_cache,
            value_cache,
            plan.block_tables,
            plan.seq_lens,
            plan.query_start_loc,
            plan.tile_seq,
            plan.tile_first,
            plan.q_tile,
            plan.kv_per_item,
            float(scale),
            plan.sliding_window,
            None if logits_soft_cap is None else float(logits_soft_cap),
        )
    finally:
        numba.set_parallel_chunksize(chunksize)
        # Where numba's pool and torch's share one OpenMP runtime, starting numba's threads
        # (in set_num_threads, the first time) sets that runtime's thread count to numba's:
        # give torch back its own. (They need not share one: see kernels/README.md, Threads.)
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)


def paged_attention_numba(
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32, contiguous: written
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int
    seq_lens: torch.Tensor,  # [num_seqs] int
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int
    scale: float,
    q_tile: int,
    num_threads: int,
    kv_per_item: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> None:
    """`plan_attention`, then `attend_planned`, on torch tensors (shapes and dtypes already
    checked by the caller)."""
    plan = plan_attention(
        block_tables,
        seq_lens,
        query_start_loc,
        query.shape[0],
        tuple(key_cache.shape),
        q_tile,
        num_threads,
        kv_per_item,
        sliding_window,
    )
    attend_planned(
        out.numpy(),
        query.contiguous().numpy(),  # usually a view into the QKV projection: copy its rows
        key_cache.numpy(),
        value_cache.numpy(),
        plan,
        scale,
        logits_soft_cap,
    )
