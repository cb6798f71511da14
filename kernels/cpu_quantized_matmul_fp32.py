"""y = x W^T with x float32 and W in GGUF blocks, in C: each block decoded to float32 in the core's cache, then float32 FMAs.

What it computes is the reference's, `models/quantized_linear.py`'s `dequantize_linear` without
its bias (W dequantized to float32, then `F.linear`): the decoded weights are `gguf`'s bit for
bit, and only the order of the dot products' sums differs (so the result equals the
reference's to float32 rounding, not bit for bit). x is not rounded, unlike the int8 kernels
(`cpu_quantized_matmul_int8.py`, `gguf_int8_activations=True`).

Why C, when the numba kernel (`cpu_quantized_matmul_numba.py`) computes the same: at a decode
batch of 32 rows the product is bound by arithmetic (32 FMAs per weight), so its speed is how
many of the core's FMA slots the inner loop fills. numba's loop keeps 4 rows of x by 4 of W
(16 sums) and leaves the vectorising to LLVM; here a micro-kernel keeps 3 rows of x by 4
output features in AVX2 registers, 8 lanes each, each loaded vector serving 3 or 4 FMAs, its
loop in inline assembly (`cpu_quantized_matmul_fp32.c` has the layout and why; kernels/README.md
the figures). Q8_0, Q4_0 and Q4_1 are decoded with vector
instructions; the K-quants (Q4_K, Q5_K, Q6_K) with plain C loops, which the compiler may
vectorise. Without AVX2 and FMA the same file compiles to plain C loops.

Built once per source text by the shared C build (`compile_library`: `cc -O3 -march=native
-fopenmp`, cached under `~/.cache/nanovllm/`) and loaded with ctypes. `load()` is None, after
one logged notice, where it cannot be built; the CPU backend then uses the numba kernel.
`dequantize` decodes a whole weight with the same row decoder, for products with many rows.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from pathlib import Path

import torch

from nanovllm.kernels.cpu_quantized_matmul_int8 import (
    BLOCK,
    QTYPES,
    _check,
    compile_library,
    eager_float32_on_cpu,
)

logger = logging.getLogger("nanovllm.kernels")

SOURCE = Path(__file__).with_suffix(".c")


def build(flags: list[str]) -> ctypes.CDLL:
    """The C file compiled with extra compiler `flags` (cached) and loaded, its functions typed.
    Raises OSError or CalledProcessError where it cannot be built."""
    lib = ctypes.CDLL(str(compile_library(SOURCE, flags)))
    pointer, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.quantized_matmul_fp32.argtypes = [pointer] * 3 + [i64, i64, i64, c_int, c_int]
    lib.dequantize_fp32.argtypes = [pointer] * 2 + [i64, i64, c_int, c_int]
    lib.has_avx2.restype = c_int
    lib.fma_peak.argtypes, lib.fma_peak.restype = [i64], ctypes.c_double
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel library, or None (with one notice) when it cannot be built."""
    try:
        return build([])
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning(
            "nanovllm: the float32 quantized matmul (C) could not be built (%s); quantized "
            "weights use the numba kernel instead.",
            str(detail).strip()[:300],
        )
        return None


def applies(x: torch.Tensor, qtype: str) -> bool:
    """Whether the kernel serves x times a `qtype` weight: float32 x on a CPU, outside
    torch.compile (which cannot trace a ctypes call), the library built."""
    return qtype in QTYPES and eager_float32_on_cpu(x) and load() is not None


def quantized_matmul(
    x: torch.Tensor,  # [num_tokens, in] float32
    raw: torch.Tensor,  # [out, in / block_size * block_bytes] uint8: the weight's blocks
    qtype: str,  # one of QTYPES
    lib: ctypes.CDLL | None = None,  # another build of the file (tests); default `load()`
) -> torch.Tensor:  # [num_tokens, out] float32
    """x W^T, W read from its blocks (see the module docstring)."""
    lib = lib or load()
    x2 = x.detach().reshape(x.shape[:-1].numel(), x.shape[-1]).contiguous()  # (K may be 0)
    raw = raw.contiguous()
    _check(x2, raw, qtype)
    m, k = x2.shape
    n = raw.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    lib.quantized_matmul_fp32(
        out.data_ptr(), x2.data_ptr(), raw.data_ptr(), m, n, k, QTYPES[qtype],
        torch.get_num_threads(),
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)


def dequantize(
    raw: torch.Tensor,  # [out, in / block_size * block_bytes] uint8
    qtype: str,  # one of QTYPES
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:  # [out, in] float32
    """W's float32 values, decoded by the kernel's own row decoder (on its threads)."""
    lib = lib or load()
    raw = raw.contiguous()
    size, nbytes = BLOCK[qtype]
    n, k = raw.shape[0], raw.shape[1] // nbytes * size
    out = torch.empty(n, k, dtype=torch.float32)
    lib.dequantize_fp32(
        out.data_ptr(), raw.data_ptr(), n, k, QTYPES[qtype], torch.get_num_threads()
    )
    return out
