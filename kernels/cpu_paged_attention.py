"""paged_attention_cpu: paged attention on a CPU that reads the KV cache in place.

The same contract as the Triton `paged_attention` (and its oracle `reference.paged_attention_ref`):
a flat batch of query tokens, sequence i owning rows `query_start_loc[i] : query_start_loc[i + 1]`
and `seq_lens[i]` tokens of context in the blocks `block_tables[i]` lists; query token j of
sequence i attends causally to positions 0 .. `seq_lens[i] - q_len_i + j`. One call serves decode,
prefill and chunked prefill (chunks and prefix-cache hits), mixed in any way, with GQA. Two
options of a layer change what a query sees: `sliding_window` W (a query at position p sees only
p - W + 1 .. p, and blocks wholly before a query tile's windows are never read) and
`logits_soft_cap` c (each scaled score s becomes c * tanh(s / c), Gemma 2's soft-capping).

Two implementations, one contract:

- the fast path, `cpu_paged_attention_numba.attend`: an online softmax over the blocks where they
  lie, compiled by numba, float32 (the CPU engine's dtype);
- the readable one, `reference.paged_attention_ref`: gather, mask, softmax in plain torch. It is
  what the fast path is tested against, and what this function runs when the fast path cannot:
  numba missing (the one-line notice below says so, once per process) or another dtype.

Within the fast path, `paged_attention_cpu_planned` sends a decode-only step (one query token per
sequence, no window, no soft cap, head_dim a multiple of 16) to `cpu_paged_attention_c`, the same
online softmax in C with AVX-512, where that library was built; the numba kernel serves the rest.

`cpu_fast_path_available()` tells a caller, before it builds a batch, which of the two it gets.

An engine calls attention once per layer with the same metadata. What the fast path works out
from the metadata alone (its checks, its int32 copies, the block ids each sequence reads, the
split into work items) is one `plan_paged_attention_cpu` call; `paged_attention_cpu_planned`
runs a layer with that plan, checking only what a layer can change (the query, the caches).
`paged_attention_cpu` is the two in one call. The CPU backend plans once per step
(`nanovllm/backends/cpu_attention_plans.py`; the per-call cost of each: kernels/README.md).
The first fast call in a fresh environment JIT-compiles the kernel; numba caches the machine code
on disk, so later processes load it instead (both times: kernels/README.md, "Measured").
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import TYPE_CHECKING

import torch

from nanovllm.kernels import checks, cpu_paged_attention_c
from nanovllm.kernels.reference import paged_attention_ref

if TYPE_CHECKING:  # (numba is optional: the plan's type is only named here)
    from nanovllm.kernels.cpu_paged_attention_numba import AttentionPlan

logger = logging.getLogger("nanovllm.kernels")

# Query tokens per tile in a prefill: DEFAULT_Q_TILE_ROWS // group. A work item holds its tile's
# queries and accumulators for the query heads of its KV heads, and fetches each K/V block from
# memory once for all of them (more rows: fewer passes over the context, fewer and longer items
# to balance over the threads).
DEFAULT_Q_TILE_ROWS = 32


@functools.cache
def _numba_kernel():
    """The numba kernel module, or None (with one logged notice) when numba cannot be imported."""
    try:
        kernel = importlib.import_module("nanovllm.kernels.cpu_paged_attention_numba")
    except ImportError as e:
        logger.warning(
            "nanovllm: numba is not available (%s); CPU paged attention falls back to the plain "
            "torch reference, which is slower. `pip install numba` for the fast path.",
            e,
        )
        return None
    return kernel


def cpu_fast_path_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether `paged_attention_cpu` runs the numba kernel for this dtype (float32 and numba)."""
    return dtype == torch.float32 and _numba_kernel() is not None


def paged_attention_cpu(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32 (or int64)
    seq_lens: torch.Tensor,  # [num_seqs] int, context length including this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int, cumulative query starts
    scale: float,
    *,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim], written if given
    q_tile: int | None = None,
    kv_per_item: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query.dtype
    """Causal attention of each sequence's new tokens over its paged context (see module doc).

    `sliding_window` (None: the whole context) and `logits_soft_cap` (None: no cap) are as
    `TorchAttention`'s; a value below 1 (window) or not above 0 (cap) is a ValueError.

    On the fast path, bad metadata (a block id outside the cache, a block table too short for
    seq_len, q_len > seq_len, query starts out of range) raises a ValueError that names the
    sequence, before the cache is read. `q_tile` (query tokens per work item) and `kv_per_item`
    (KV heads per work item, a divisor of num_kv_heads; default: all of them when there are
    enough tiles) are tuning knobs: any valid value gives the same answer.
    """
    num_tokens, num_heads, _, _, num_kv_heads, _ = checks.check_paged_attention_args(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc
    )
    if query.device.type != "cpu":
        raise ValueError(f"paged_attention_cpu needs CPU tensors, got them on {query.device}")
    if out is not None and (out.shape != query.shape or out.dtype != query.dtype):
        raise ValueError(
            f"out must be {tuple(query.shape)} {query.dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    if q_tile is None:
        q_tile = max(1, DEFAULT_Q_TILE_ROWS // (num_heads // num_kv_heads))
    if q_tile < 1:
        raise ValueError(f"q_tile must be >= 1, got {q_tile}")
    checks.check_window_and_soft_cap(sliding_window, logits_soft_cap)

    if not cpu_fast_path_available(query.dtype):
        result = paged_attention_ref(
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
        )
        return result if out is None else out.copy_(result)

    plan = plan_paged_attention_cpu(
        key_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        num_tokens,
        num_heads,
        q_tile=q_tile,
        kv_per_item=kv_per_item,
        sliding_window=sliding_window,
    )
    result = (
        out
        if out is not None and out.is_contiguous()
        else torch.empty(query.shape, dtype=torch.float32)
    )
    _numba_kernel().attend_planned(
        result.numpy(),
        query.contiguous().numpy(),  # usually a view into the QKV projection: copy its rows
        key_cache.numpy(),
        value_cache.numpy(),
        plan,
        scale,
        logits_soft_cap,
    )
    if out is not None and result is not out:
        out.copy_(result)
    return result if out is None else out


def plan_paged_attention_cpu(
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32 (or int64)
    seq_lens: torch.Tensor,  # [num_seqs] int
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int
    num_tokens: int,
    num_heads: int,
    *,
    q_tile: int | None = None,
    kv_per_item: int | None = None,
    sliding_window: int | None = None,
) -> AttentionPlan:
    """The part of `paged_attention_cpu`'s fast path that depends only on the step's metadata
    (and the cache's shape, the query's size and the layer's window): the checks of the
    metadata, its int32 numpy copies and the work split. `paged_attention_cpu_planned` then
    runs any number of layers with it. A bad value raises as `paged_attention_cpu` does.
    Needs the fast path (`cpu_fast_path_available()`)."""
    if not cpu_fast_path_available(key_cache.dtype):
        raise ValueError(
            f"the CPU kernel needs float32 and numba, got {key_cache.dtype} "
            f"(numba {'present' if _numba_kernel() else 'missing'}): use paged_attention_cpu"
        )
    num_kv_heads = checks.check_kv_cache(key_cache, key_cache)[2]
    checks.check_attention_metadata(block_tables, seq_lens, query_start_loc)
    checks.check_same_device(
        key_cache=key_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
    )
    if key_cache.device.type != "cpu":
        raise ValueError(f"paged_attention_cpu needs CPU tensors, got them on {key_cache.device}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if q_tile is None:
        q_tile = max(1, DEFAULT_Q_TILE_ROWS // (num_heads // num_kv_heads))
    if q_tile < 1:
        raise ValueError(f"q_tile must be >= 1, got {q_tile}")
    checks.check_window_and_soft_cap(sliding_window, None)
    return _numba_kernel().plan_attention(
        block_tables,
        seq_lens,
        query_start_loc,
        num_tokens,
        tuple(key_cache.shape),
        q_tile,
        torch.get_num_threads(),  # as many as torch (a caller may have set 1)
        kv_per_item,
        sliding_window,
    )


def paged_attention_cpu_planned(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    plan: AttentionPlan,  # `plan_paged_attention_cpu`'s, for this step's metadata
    scale: float,
    *,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim] float32
    """`paged_attention_cpu` with the metadata's work done once for the step (`plan`): per
    call, only what the query and the caches can change is checked (the plan holds the rest).
    A decode-only plan without window or soft cap (`cpu_paged_attention_c.applies`) runs the
    C kernel where it was built (AVX-512), anything else the numba kernel."""
    if (
        query.dtype != torch.float32
        or query.dim() != 3
        or query.shape[0] != plan.num_tokens
        or query.shape[2] != plan.cache_shape[3]
        or query.shape[1] % plan.cache_shape[2]
        or key_cache.shape != plan.cache_shape
        or value_cache.shape != plan.cache_shape
        or key_cache.dtype != torch.float32
        or value_cache.dtype != torch.float32
    ):
        raise ValueError(
            f"query {tuple(query.shape)} {query.dtype} and caches {tuple(key_cache.shape)} "
            f"{key_cache.dtype}, {tuple(value_cache.shape)} {value_cache.dtype} do not fit the "
            f"plan ({plan.num_tokens} tokens, a float32 cache of shape {plan.cache_shape})"
        )
    if cpu_paged_attention_c.applies(query, plan, logits_soft_cap):
        # A decode-only step without window or cap: the C kernel (AVX-512), where it was built.
        return cpu_paged_attention_c.attend(query, key_cache, value_cache, plan, scale)
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    _numba_kernel().attend_planned(
        out.numpy(),
        query.contiguous().numpy(),  # usually a view into the QKV projection: copy its rows
        key_cache.numpy(),  # (a strided cache has no numpy view that numba reads: it raises)
        value_cache.numpy(),
        plan,
        scale,
        logits_soft_cap,
    )
    return out
