"""y = x W^T with W in Q8_0, Q4_0 or Q4_1 blocks and x rounded to int8 blocks: AVX-512 VNNI with 16 output features in each vector.

What it computes: the int8 kernel's product (`cpu_quantized_matmul_int8.py`), x rounded to
int8 blocks of 32 exactly as there (dx = max |x| / 127, qx = round(x / dx)), each block's 32
products summed in int32 (exact), then scaled by dx dw in float32. Its oracle is the same
`quantized_matmul_ref`; the two kernels differ only by the order of the float32 sums.

Why it exists: the int8 kernel sums row by row. Per (row of x, feature, 2 blocks) it spends
one `vpdpbusd` (64 byte products), then a conversion, the scales' product and an FMA, and adds
the 16 lanes at the end: as many vector instructions per product as float32's FMAs (16 products
each), so on a CPU without AMX (AMD Zen 4) it was slower than the exact float32 C kernel. Here
each vector holds 16 output features instead: one `vpdpbusd` multiplies 4 quants of one row of
x (broadcast to all lanes) by the same 4 positions of 16 features, and the int32 lanes are
already the 16 outputs, so per block the scaling costs a conversion, a product and an FMA per
16 outputs, not per output.

Layout (the C file's header has the formulas): `vpdpbusd` multiplies unsigned bytes by signed
ones, so the weights are the unsigned side (Q8_0's quants + 128, Q4's nibbles 0..15 as stored),
x stays signed, and the offset (-128 sum(qx) for Q8_0, -8 sum(qx) for Q4_0) starts each block's
int32 sums, once per (row, block). Features go in panels of 32 (two vectors); each panel's
blocks are decoded once per call into the thread's scratch, quad-major:
wq [blocks][8 quads][32 features][4 bytes] with dw (and Q4_1's mw) [blocks][32] float32, by a
SIMD transposition (24 two-register permutes per 16 features and block for Q8_0, 8 for Q4 plus
the nibble split), and then used by every row of x.

Cost per block: a micro-kernel of 4 rows x 32 features does 8 quads x 8 `vpdpbusd` (4,096
byte products) and 8 conversions, 8 products and 8 FMAs (16 FMAs for Q4_1): about 90 vector
instructions where float32 needs 256 FMAs. The decode (the transposition) runs once per weight
and call, amortized over the rows of x (kernels/README.md measures its share).

K-quants (Q4_K, Q5_K, Q6_K) are not covered (`applies` is False): their 6-bit sub-block scales
and minima (and Q6_K's 16-weight halves, with a scale each) would have to be decoded per
sub-block of 32 or 16 into the same layout and Q6_K would need its halves' products on
separate lanes, which this layout does not keep; the int8 kernel keeps serving them.

Built with the shared `compile_library` (`cc -O3 -march=native -fopenmp`, cached under
`~/.cache/nanovllm/`), only where the CPU lists avx512_vnni and avx512bw; otherwise, or when
the build fails, `load()` is None after one logged notice and the int8 kernel serves as before.
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
    _cpu_flags,
    check_blocks,
    compile_library,
    eager_float32_on_cpu,
    matmul_rounding_x_in_c,
)

logger = logging.getLogger("nanovllm.kernels")

QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2}  # the C file's codes
SOURCE = Path(__file__).with_suffix(".c")
NAME = "AVX-512 VNNI, 16 features a vector"  # (for quantized_kernel_name)


def _build(cpu_flags: str) -> ctypes.CDLL | None:
    """The library built for a CPU with these /proc/cpuinfo lines; else None, with one notice
    saying why."""
    try:
        missing = {"avx512_vnni", "avx512bw", "avx512f"} - set(cpu_flags.split())
        if missing:
            raise OSError(f"the CPU does not list {' '.join(sorted(missing))}")
        lib = ctypes.CDLL(str(compile_library(SOURCE, [])))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning(
            "nanovllm: the VNNI int8 matmul (16 features a vector) is not used (%s); int8 "
            "activations use the row-by-row int8 kernel (cpu_quantized_matmul_int8) instead.",
            str(detail).strip()[:300],
        )
        return None
    pointer, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.quantized_matmul_vnni.argtypes = [pointer] * 3 + [i64, i64, i64, c_int, c_int]
    lib.decode_only_vnni.argtypes = [pointer, i64, i64, c_int, c_int]
    lib.quantize_x_vnni.argtypes = [pointer, i64, i64, c_int] + [pointer] * 4
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The kernel library for this machine, or None (with one notice)."""
    return _build(_cpu_flags())


def applies(x: torch.Tensor, qtype: str) -> bool:
    """Whether the kernel serves x times a `qtype` weight: Q8_0, Q4_0 or Q4_1 (not the
    K-quants: the module docstring), `eager_float32_on_cpu`, the library built."""
    return qtype in QTYPES and eager_float32_on_cpu(x) and load() is not None


def quantized_matmul(
    x: torch.Tensor,  # [num_tokens, in] float32
    raw: torch.Tensor,  # [out, in / 32 * block_bytes] uint8: the weight's blocks
    qtype: str,  # one of QTYPES
) -> torch.Tensor:  # [num_tokens, out] float32
    """x W^T, x rounded to int8 blocks, 16 features a vector (the module docstring)."""
    check_blocks(x.shape[-1], raw, qtype, QTYPES)
    lib = load()
    if lib is None:
        raise RuntimeError("the VNNI kernel is not available on this machine (see load())")
    return matmul_rounding_x_in_c(lib.quantized_matmul_vnni, x, raw, QTYPES[qtype])


def decode_only(raw: torch.Tensor, qtype: str) -> None:
    """Only the panels' decode, as one call of `quantized_matmul` does it (for measurements)."""
    raw = raw.contiguous()
    k = raw.shape[1] // BLOCK[qtype][1] * 32
    check_blocks(k, raw, qtype, QTYPES)
    load().decode_only_vnni(raw.data_ptr(), raw.shape[0], k, QTYPES[qtype], torch.get_num_threads())
