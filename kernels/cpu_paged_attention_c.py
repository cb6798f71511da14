"""Decode paged attention on a CPU in C with AVX-512: one query token per sequence, its 16 keys'
scores in one vector.

What it computes: `paged_attention_cpu`'s answer (`reference.paged_attention_ref` is the oracle)
for a decode batch: sequence i has exactly one query token, at position seq_lens[i] - 1, and it
attends to positions 0 .. seq_lens[i] - 1 in the blocks `block_tables[i]` lists, with GQA (any
number of query heads per KV head), no sliding window, no soft cap, float32, head_dim a multiple
of 16, any block_size. The online softmax over chunks of 16 positions is the numba kernel's (the
C file's header has the formulas); a slot at or past seq_len is never read.

Why it exists: a decode step reads every context's K/V once, so it is bound by memory, and the
numba kernel (`cpu_paged_attention_numba.attend`) read K/V at about 45% of this machine's copy
rate: per (query row, key) LLVM's vectorised dot product ends in a horizontal sum, the exp runs
per score, and the values' loop reloads the accumulators. Here 16 keys' partial dot products are
reduced together into one vector of 16 scores (a transpose-reduce, `hsum16`), the exp runs on
those 16 at once (Cephes' polynomial, the numba kernel's `exp_nonpositive`), and each
accumulator vector takes 16 FMAs per load and store. Measured in kernels/README.md ("A C decode
kernel").

Where it serves: `cpu_paged_attention.paged_attention_cpu_planned` calls it when `applies` (a
decode-only plan, no window, no cap, float32, head_dim % 16 == 0, the library built), else the
numba kernel as before. It takes the numba plan's checked int32 metadata (block ids in range,
tables long enough) and its `kv_per_item` (all KV heads per work item, one contiguous run of
memory per key, when the batch gives every thread a few sequences; else one KV head per item).

Built with the shared `compile_library` (`cc -O3 -march=native -fopenmp`, cached under
`~/.cache/nanovllm/`), only where the CPU lists avx512f; otherwise, or when the build fails,
`load()` is None after one logged notice and the numba kernel serves.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nanovllm.kernels.cpu_quantized_matmul_int8 import _cpu_flags, build_for_cpu

if TYPE_CHECKING:  # (numba is optional: the plan's type is only named here)
    from nanovllm.kernels.cpu_paged_attention_numba import AttentionPlan


SOURCE = Path(__file__).with_suffix(".c")


def _build(cpu_flags: str) -> ctypes.CDLL | None:
    """The library built for a CPU with these /proc/cpuinfo lines; else None, with one notice
    saying why."""
    lib = build_for_cpu(
        SOURCE, cpu_flags, ("avx512f",), "the C decode attention kernel (AVX-512)",
        "decode steps use the numba kernel (cpu_paged_attention_numba)",
    )  # fmt: skip
    if lib is None:
        return None
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.paged_attention_decode_c.argtypes = (
        [pointer] * 6
        + [i64] * 6
        + [
            ctypes.c_float,
            i64,
            ctypes.c_int,
        ]
    )
    lib.paged_attention_decode_c.restype = None
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The kernel library for this machine, or None (with one notice)."""
    return _build(_cpu_flags())


def applies(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    plan: AttentionPlan,
    logits_soft_cap: float | None,
) -> bool:
    """Whether the C kernel serves this call: a decode-only plan, no window, no soft cap,
    float32, head_dim a multiple of 16, the library built (the module docstring)."""
    return (
        query.dtype == torch.float32
        and query.shape[-1] % 16 == 0
        and plan.sliding_window is None
        and logits_soft_cap is None
        and load() is not None
        and plan.decode_only
    )


def attend(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim] float32: one token per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    value_cache: torch.Tensor,  # the same
    plan: AttentionPlan,  # the numba kernel's, for a decode-only batch (`applies`)
    scale: float,
    kv_per_item: int | None = None,  # KV heads per work item (default: the plan's)
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim] float32
    """softmax(scale q k^T) v for each sequence's one query token over its paged context."""
    lib = load()
    if lib is None:
        raise RuntimeError("the C attention kernel is not available here (see load())")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the C attention kernel reads contiguous caches only")
    _, block_size, num_kv_heads, head_dim = plan.cache_shape
    kv_per_item = plan.kv_per_item if kv_per_item is None else kv_per_item
    if kv_per_item < 1 or num_kv_heads % kv_per_item:
        raise ValueError(f"kv_per_item={kv_per_item} must divide num_kv_heads={num_kv_heads}")
    query = query.contiguous()
    out = torch.empty_like(query)
    tables, seq_lens = plan.block_tables, plan.seq_lens  # int32, contiguous (the plan's)
    lib.paged_attention_decode_c(
        out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        tables.ctypes.data, seq_lens.ctypes.data,
        len(seq_lens), tables.shape[1], block_size, num_kv_heads, query.shape[1], head_dim,
        float(scale), kv_per_item, torch.get_num_threads(),
    )  # fmt: skip
    return out
