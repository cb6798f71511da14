"""y = x W^T with W in Q8_0, Q4_0, Q4_1, Q4_K or Q5_K blocks and x quantized to int8 blocks: the int8 kernel's arithmetic on AMX tiles.

Why: the int8 kernel (`cpu_quantized_matmul_int8.py`) sums each block's 32 byte products with
AVX-512 VNNI, and at a decode batch of 32 rows it is bound by arithmetic: per 64 products a
`vpdpbusd`, a conversion, the scales' product and an FMA, no fewer instructions than float32's
FMAs, so MKL's float32 matmul keeps up with it. A CPU with AMX (Intel's Advanced Matrix
Extensions, `amx_int8` in /proc/cpuinfo, since Sapphire Rapids) has tile registers and one
instruction, `tdpbssd`, that multiplies a 16 x 32 tile of signed bytes by a 32 x 16 one into a
16 x 16 tile of int32 sums: 8,192 products. Each block of 32 still has its own scales, so the
tile's sums are taken out after every block and scaled with AVX-512 (as llama.cpp's AMX
backend does), which leaves 3 vector instructions per 16 outputs and block instead of about
2 per output and block: `cpu_quantized_matmul_amx.c` holds the layout and the formulas.

x is rounded exactly as the int8 kernel rounds it (`quantized_matmul_ref` in
`cpu_quantized_matmul_int8.py` is the oracle of both); the int32 sums are exact, so the two
differ only by the order of the float32 sums over blocks.

Built like the int8 kernel (`cc -O3 -march=native -mamx-tile -mamx-int8 -fopenmp`, cached under
`~/.cache/nanovllm/`) and used only where the CPU lists `amx_int8`, the build succeeds, and
Linux grants the process the tiles' state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); otherwise
`load()` is None after one logged notice and the int8 layers keep the VNNI kernel.
Q6_K is not covered (its sub-blocks of 16 would need tiles of K = 16; `applies` is False for it,
and the VNNI kernel serves it).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from pathlib import Path

import torch

from nanovllm.kernels.cpu_quantized_matmul_int8 import (
    _cpu_flags,
    check_blocks,
    compile_library,
    eager_float32_on_cpu,
    matmul_rounding_x_in_c,
)

logger = logging.getLogger("nanovllm.kernels")

QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3, "Q5_K": 4}  # the C file's codes
SOURCE = Path(__file__).with_suffix(".c")


def _build(cpu_flags: str) -> ctypes.CDLL | None:
    """The library built for a CPU with these /proc/cpuinfo lines, the tiles granted; else
    None, with one notice saying why."""
    try:
        if "amx_int8" not in cpu_flags.split():
            raise OSError("the CPU does not list amx_int8")
        library = compile_library(SOURCE, ["-mamx-tile", "-mamx-int8"])
        lib = ctypes.CDLL(str(library))
        if not lib.amx_request_permission():
            raise OSError("Linux did not grant the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning(
            "nanovllm: the AMX int8 matmul is not used (%s); int8 activations use the int8 kernel "
            "(cpu_quantized_matmul_int8: AVX-512 VNNI, AVX2 or plain loops) instead.",
            str(detail).strip()[:300],
        )
        return None
    pointer, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.quantized_matmul_amx.argtypes = [pointer] * 3 + [i64, i64, i64, c_int, c_int]
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The AMX kernel library for this machine, or None (with one notice)."""
    return _build(_cpu_flags())


def applies(x: torch.Tensor, qtype: str) -> bool:
    """Whether the kernel serves x times a `qtype` weight: float32 x on a CPU, outside
    torch.compile (which cannot trace a ctypes call), the library built and the tiles granted."""
    return qtype in QTYPES and eager_float32_on_cpu(x) and load() is not None


def quantized_matmul(
    x: torch.Tensor,  # [num_tokens, in] float32
    raw: torch.Tensor,  # [out, in / 32 * block_bytes] uint8: the weight's blocks
    qtype: str,  # one of QTYPES
) -> torch.Tensor:  # [num_tokens, out] float32
    """x W^T, x quantized to int8 blocks, the blocks' sums on AMX tiles (the module docstring)."""
    check_blocks(x.shape[-1], raw, qtype, QTYPES)
    lib = load()
    if lib is None:
        raise RuntimeError("the AMX kernel is not available on this machine (see load())")
    return matmul_rounding_x_in_c(lib.quantized_matmul_amx, x, raw, QTYPES[qtype])
