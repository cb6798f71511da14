"""y = x W^T with W in llama.cpp's Q8_0, Q4_0, Q4_1 or K-quant (Q4_K, Q5_K, Q6_K) blocks and x quantized to 8-bit blocks: integer dot products in C.

Why: the numba kernel (`cpu_quantized_matmul_numba.py`) turns each weight into a float32 and
multiplies in float32, so at a batch of 32 rows it is bound by arithmetic and MKL's float32
matmul beats it. llama.cpp's CPU kernels instead quantize x too, 32 values at a time to int8
with one float scale, and sum a block's 32 products in integers: one AVX-512 VNNI
instruction (`vpdpbusd`) does 32 multiply-adds of bytes where a float32 FMA does 16 of 4-byte
floats, and a weight byte stays a byte. numba cannot emit that instruction; C with intrinsics
can (`cpu_quantized_matmul_int8.c`, which holds the formulas). Without VNNI (AMD's Zen 3,
Intel before Ice Lake) the same C sums a block with AVX2's `vpmaddubsw` and `vpmaddwd`, as
llama.cpp's AVX2 kernels do, and without AVX2 with plain loops (`instruction_set()` says which).

The price is x's rounding: each value of x is rounded to one of 255 steps of its block's
largest magnitude (an error up to 1/254 of it), as llama.cpp does, so the result is not the
reference's (`dequantize_linear`: W dequantized, x as it is) but close to it;
`quantized_matmul_ref` here computes the same rounding in torch, and the kernel equals it up
to the order of float sums (tests/kernels/test_kernel_quantized_matmul_int8.py).

The C file is compiled once per source text with the system's C compiler
(`cc -O3 -march=native -fopenmp`) into `~/.cache/nanovllm/` (or `$NANOVLLM_CACHE_DIR`), and
loaded with ctypes. `load()` is None, after one logged notice, when there is no compiler or
the build fails; the backend then keeps the numba kernel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger("nanovllm.kernels")

QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5}  # C, numba codes
BLOCK = {  # weights and bytes per block
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}  # fmt: skip
SOURCE = Path(__file__).with_suffix(".c")


def _cache_dir() -> Path:
    return Path(os.environ.get("NANOVLLM_CACHE_DIR", Path.home() / ".cache" / "nanovllm"))


def _cpu_flags() -> str:
    """The CPU's model and feature flags (Linux), else the machine's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return " ".join([line for line in lines if line.startswith(("model name", "flags"))][:2])


def compile_library(source: Path, flags: list[str]) -> Path:
    """`source` built into a shared library by the system's C compiler with `-march=native`
    and `flags` (at most once: cached by the source, flags, compiler and CPU). Raises OSError or
    CalledProcessError where it cannot be built."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    # (-march=native: a library built for one CPU may not run on another sharing the cache)
    build = f"{compiler} {' '.join(flags)} {_cpu_flags()}"
    key = hashlib.sha256(source.read_bytes() + build.encode()).hexdigest()
    library = _cache_dir() / f"{source.stem}-{key[:16]}.so"
    if not library.exists():
        if compiler is None:
            raise OSError("no C compiler (cc or gcc) on PATH")
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
            built = Path(tmp) / library.name  # built aside, then moved: no half-written file
            subprocess.run(
                [compiler, "-O3", "-march=native", *flags, "-fopenmp", "-shared", "-fPIC",
                 "-o", str(built), str(source), "-lm"],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            built.replace(library)
    return library


def build_for_cpu(
    source: Path, cpu_flags: str, needs: tuple[str, ...], kernel: str, instead: str
) -> ctypes.CDLL | None:
    """`source` built and loaded for a CPU with these /proc/cpuinfo lines, which must list every
    flag in `needs`; else None, with one notice that `kernel` is not used and `instead` is."""
    try:
        missing = set(needs) - set(cpu_flags.split())
        if missing:
            raise OSError(f"the CPU does not list {' '.join(sorted(missing))}")
        return ctypes.CDLL(str(compile_library(source, [])))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning(
            "nanovllm: %s is not used (%s); %s instead.", kernel, str(detail).strip()[:300], instead
        )
        return None


ISAS = {2: "AVX-512 VNNI", 1: "AVX2", 0: "plain C loops"}  # kernel_isa()'s codes


@functools.cache
def load_variant(flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The kernel library built with these extra compiler flags (`("-mno-avx2",)`: the plain
    loops, which the tests compare with), or None (with one notice) when it cannot be built."""
    try:
        library = compile_library(SOURCE, list(flags))
        lib = ctypes.CDLL(str(library))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning(
            "nanovllm: the int8 quantized matmul could not be built (%s); quantized weights use "
            "the numba kernel instead.",
            str(detail).strip()[:300],
        )
        return None
    pointer, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.quantize_rows_q8.argtypes = [pointer, i64, i64, pointer, pointer, pointer]
    lib.quantized_matmul_int8.argtypes = [pointer] * 5 + [i64, i64, i64, c_int, c_int]
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel library for this CPU (`-march=native`: VNNI, else AVX2, else the
    plain loops, with one notice), or None (with one notice) when it cannot be built."""
    lib = load_variant()
    if lib is not None and lib.kernel_isa() == 0:
        logger.warning(
            "nanovllm: the CPU has neither AVX-512 VNNI nor AVX2; the int8 quantized matmul "
            "runs plain C loops (slower than the numba kernel)."
        )
    return lib


def instruction_set(lib: ctypes.CDLL | None = None) -> str:
    """Which sums `lib` (default: `load()`'s) was compiled with: one of `ISAS`' values."""
    lib = lib or load()
    return "none" if lib is None else ISAS[lib.kernel_isa()]


def eager_float32_on_cpu(x: torch.Tensor) -> bool:
    """What every CPU quantized kernel (C or numba) needs of x: float32 on a CPU, outside
    torch.compile (which can trace neither a ctypes nor a numba call)."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and not torch.compiler.is_compiling()


def applies(x: torch.Tensor, qtype: str) -> bool:
    """Whether the kernel serves x times a `qtype` weight: `eager_float32_on_cpu`, the library
    built."""
    return qtype in QTYPES and eager_float32_on_cpu(x) and load() is not None


def check_blocks(k: int, raw: torch.Tensor, qtype: str, qtypes=QTYPES) -> None:
    """ValueError, naming the bad value, unless `qtype` is one of `qtypes` (a kernel's) and
    `raw` [out, bytes] holds rows of whole `qtype` blocks for `k` input features."""
    if qtype not in qtypes:
        raise ValueError(f"qtype must be one of {list(qtypes)}, got {qtype!r}")
    size, nbytes = BLOCK[qtype]
    if k % size or raw.dim() != 2 or raw.shape[1] != k // size * nbytes:
        raise ValueError(
            f"x has {k} features; a {qtype} row of them is {k // size * nbytes} bytes "
            f"(whole blocks of {size}), raw has shape {tuple(raw.shape)}"
        )


def _check(x2: torch.Tensor, raw: torch.Tensor, qtype: str) -> None:
    check_blocks(x2.shape[1], raw, qtype)


def matmul_rounding_x_in_c(function, x: torch.Tensor, raw: torch.Tensor, code: int) -> torch.Tensor:
    """x W^T through a C `function(out, x, w, M, N, K, qtype code, threads)` that rounds x to
    int8 blocks itself (the VNNI and AMX kernels): x as a contiguous float32 [M, K], out
    [..., N] float32. The caller has checked the shapes (`check_blocks`)."""
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    raw = raw.contiguous()
    (m, k), n = x2.shape, raw.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    function(out.data_ptr(), x2.data_ptr(), raw.data_ptr(), m, n, k, code, torch.get_num_threads())
    return out.view(*x.shape[:-1], n)


def quantized_matmul(
    x: torch.Tensor,  # [num_tokens, in] float32
    raw: torch.Tensor,  # [out, in / 32 * block_bytes] uint8: the weight's blocks
    qtype: str,  # one of QTYPES
    lib: ctypes.CDLL | None = None,  # default: load()'s; a `load_variant` for the tests
) -> torch.Tensor:  # [num_tokens, out] float32
    """x W^T, x quantized to int8 blocks, W read from its blocks (see the module docstring)."""
    lib = lib or load()
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    raw = raw.contiguous()
    _check(x2, raw, qtype)
    m, k = x2.shape
    n = raw.shape[0]
    xu = torch.empty(m, k, dtype=torch.uint8)  # x's quants + 128
    dx = torch.empty(m, k // 32 * 8, dtype=torch.float32)  # each block's scale, 8 times
    sx = torch.empty(m, k // 32, dtype=torch.float32)
    lib.quantize_rows_q8(x2.data_ptr(), m, k, xu.data_ptr(), dx.data_ptr(), sx.data_ptr())
    out = torch.empty(m, n, dtype=torch.float32)
    lib.quantized_matmul_int8(
        out.data_ptr(), xu.data_ptr(), dx.data_ptr(), sx.data_ptr(), raw.data_ptr(),
        m, n, k, QTYPES[qtype], torch.get_num_threads(),
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)


def quantize_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 in blocks of 32 as int8 with one scale each, in torch: (qx [M, K / 32,
    32] as float32, dx [M, K / 32, 1]); the C `quantize_rows_q8`'s formulas."""
    blocks = x.to(torch.float32).reshape(x.shape[0], -1, 32)
    dx = blocks.abs().amax(-1, keepdim=True) / 127.0
    inverse = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))
    # C's roundf (as llama.cpp's quantize_row_q8_0_ref): halves away from zero, where
    # torch.round takes them to even.
    # A float32 x / dx lands on k + 1/2 for about one value in 10^5 of random x: often enough in
    # a batch. (v - trunc(v) is exact, so the comparison with 0.5 is.)
    scaled = blocks * inverse
    whole = torch.trunc(scaled)
    return whole + torch.sign(scaled) * ((scaled - whole).abs() >= 0.5), dx


def quantized_matmul_ref(
    x: torch.Tensor,  # [M, K] float32
    w: torch.Tensor,  # [N, K] float32: W dequantized (gguf_quants.dequantize)
) -> torch.Tensor:  # [M, N] float32
    """x W^T with x rounded as the kernel rounds it: the kernel's oracle, in plain torch."""
    qx, dx = quantize_rows_ref(x)
    return (qx * dx).reshape(x.shape) @ w.T
