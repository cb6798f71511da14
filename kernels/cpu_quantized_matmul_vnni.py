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
int32 sums, once per (row, block). Features go in panels of 32 (two vectors), each panel's
blocks packed quad-major: [quads][32 features][4 bytes] (Q4: the 4 dwords of packed nibbles,
split in the micro-kernel), then the 32 float16 scales (and Q4_1's minima). That is the panel's
bytes permuted, no more of them. `pack` packs every panel once (`unpack` is its inverse, in
torch); `quantized_matmul_packed` multiplies by the packed panels, and `quantized_matmul`, on the
file's rows, packs each panel into the thread's scratch in each call (24 two-register permutes
per 16 features and block for Q8_0, 8 for Q4), which at a decode step's 32 rows was 16-36% of
the call (kernels/README.md). The int8 layers hold packed weights
(`backends/cpu_quantized_packed.py`).

Cost per block: a micro-kernel of 4 rows x 32 features does 8 quads x 8 `vpdpbusd` (4,096
byte products) and 8 conversions, 8 products and 8 FMAs (16 FMAs for Q4_1): about 90 vector
instructions where float32 needs 256 FMAs.

K-quants (Q4_K, Q5_K, Q6_K) are not covered (`applies` is False): their 6-bit sub-block scales
and minima (and Q6_K's 16-weight halves, with a scale each) would have to be unpacked per
sub-block of 32 or 16 into the same layout and Q6_K would need its halves' products on
separate lanes, which this layout does not keep; the int8 kernel keeps serving them.

Built with the shared `compile_library` (`cc -O3 -march=native -fopenmp`, cached under
`~/.cache/nanovllm/`), only where the CPU lists avx512_vnni and avx512bw; otherwise, or when
the build fails, `load()` is None after one logged notice and the int8 kernel serves as before.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from nanovllm.kernels.cpu_quantized_matmul_int8 import (
    BLOCK,
    _cpu_flags,
    build_for_cpu,
    check_blocks,
    eager_float32_on_cpu,
    matmul_rounding_x_in_c,
)

QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2}  # the C file's codes
SOURCE = Path(__file__).with_suffix(".c")
NAME = "AVX-512 VNNI, 16 features a vector"
PANEL = 32  # features in a panel (the C file's NR)  # (for quantized_kernel_name)


def _build(cpu_flags: str) -> ctypes.CDLL | None:
    """The library built for a CPU with these /proc/cpuinfo lines; else None, with one notice
    saying why."""
    lib = build_for_cpu(
        SOURCE, cpu_flags, ("avx512_vnni", "avx512bw", "avx512f"),
        "the VNNI int8 matmul (16 features a vector)",
        "int8 activations use the row-by-row int8 kernel (cpu_quantized_matmul_int8)",
    )  # fmt: skip
    if lib is None:
        return None
    pointer, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.quantized_matmul_vnni.argtypes = [pointer] * 3 + [i64, i64, i64, c_int, c_int]
    lib.quantized_matmul_vnni_packed.argtypes = [pointer] * 3 + [i64, i64, i64, c_int, c_int]
    lib.pack_vnni.argtypes = [pointer, pointer, i64, i64, c_int, c_int]
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


def pack(raw: torch.Tensor, qtype: str) -> torch.Tensor:  # -> [panels * 32, row bytes] uint8
    """W's blocks packed once, for `quantized_matmul_packed`: the panels of 32 features that a call
    of `quantized_matmul` packs into scratch (the layout in the module docstring), all of them.
    The same bytes, permuted (Q8_0's quants + 128), in as many bytes as W's rows padded to a
    multiple of 32 (the padding: copies of the last row); `unpack` is its inverse."""
    raw = raw.contiguous()
    k = raw.shape[1] // BLOCK[qtype][1] * 32 if qtype in QTYPES else 0
    check_blocks(k, raw, qtype, QTYPES)
    lib = load()
    if lib is None:
        raise RuntimeError("the VNNI kernel is not available on this machine (see load())")
    packed = torch.empty(-(-raw.shape[0] // PANEL) * PANEL, raw.shape[1], dtype=torch.uint8)
    lib.pack_vnni(
        packed.data_ptr(), raw.data_ptr(), raw.shape[0], k, QTYPES[qtype], torch.get_num_threads()
    )
    return packed


def pack_ref(raw: torch.Tensor, qtype: str) -> torch.Tensor:  # -> [panels * 32, row bytes] uint8
    """`pack` in torch (reshapes and permutes, on any CPU): the reference the C packing is tested
    against, and `unpack`'s inverse."""
    size, block_bytes = BLOCK[qtype]
    n, nb = raw.shape[0], raw.shape[1] // block_bytes
    padded = torch.cat([raw, raw[-1:].expand(-(-n // PANEL) * PANEL - n, -1)])
    blocks = padded.view(-1, PANEL, nb, block_bytes)  # [panels, 32 features, nb, block]
    scale_bytes = block_bytes - (32 if qtype == "Q8_0" else 16)  # d (and Q4_1's m) first
    quants = blocks[..., scale_bytes:]  # [panels, 32, nb, quads * 4]
    if qtype == "Q8_0":
        quants = quants ^ 0x80
    quads = quants.reshape(*quants.shape[:3], -1, 4).permute(0, 2, 3, 1, 4)  # [p, nb, quads, 32, 4]
    halves = blocks[..., :scale_bytes].reshape(*blocks.shape[:3], -1, 2).permute(0, 2, 3, 1, 4)
    panel_blocks = torch.cat([quads.flatten(2), halves.flatten(2)], dim=-1)  # [p, nb, 32 * block]
    return panel_blocks.reshape(-1, nb * block_bytes)


def unpack(
    packed: torch.Tensor,  # [panels * 32, row bytes] uint8, from `pack`
    qtype: str,
    rows: torch.Tensor | None = None,  # [n] int64: which of W's rows (default: all 32 * panels)
) -> torch.Tensor:  # [n, row bytes] uint8: those rows of W as the file stores them
    """W's rows in the file's block layout again, from `pack`'s (torch's indexing, not C: the
    tests' independent check of `pack`, and the token embedding's lookup of a few rows)."""
    size, block_bytes = BLOCK[qtype]
    nb = packed.shape[1] // block_bytes
    quant_bytes = 32 if qtype == "Q8_0" else 16  # per block of one feature
    panels = packed.view(-1, nb, PANEL * block_bytes)  # [panels, nb, a panel's block]
    rows = torch.arange(packed.shape[0]) if rows is None else rows
    panel, feature = rows // PANEL, rows % PANEL
    chosen = panels[panel]  # [n, nb, a panel's block]
    # quants: [n, nb, quads, 32 features, 4 bytes] -> each row's [n, nb, quads * 4]
    quads = chosen[..., : PANEL * quant_bytes].view(len(rows), nb, quant_bytes // 4, PANEL, 4)
    quants = quads[torch.arange(len(rows)), :, :, feature].reshape(len(rows), nb, quant_bytes)
    if qtype == "Q8_0":
        quants = quants ^ 0x80
    # scales: float16 [n, nb, 32 features, 2 bytes] (then Q4_1's minima, the same)
    halves = chosen[..., PANEL * quant_bytes :].view(len(rows), nb, -1, PANEL, 2)
    scales = halves[torch.arange(len(rows)), :, :, feature].reshape(len(rows), nb, -1)
    return torch.cat([scales, quants], dim=-1).reshape(len(rows), nb * block_bytes)


def quantized_matmul_packed(
    x: torch.Tensor,  # [num_tokens, in] float32
    packed: torch.Tensor,  # from `pack`
    qtype: str,  # one of QTYPES
    out_features: int,  # W's rows (packed has them padded to a multiple of 32)
) -> torch.Tensor:  # [num_tokens, out] float32
    """`quantized_matmul` with W packed beforehand: the same arithmetic, without the packing."""
    k = x.shape[-1]
    check_blocks(k, packed, qtype, QTYPES)
    if not 0 < out_features <= packed.shape[0] or packed.shape[0] % PANEL:
        raise ValueError(
            f"packed has {packed.shape[0]} rows (panels of {PANEL}); W's {out_features} do not fit"
        )
    x2 = x.detach().reshape(-1, k).to(torch.float32).contiguous()
    out = torch.empty(x2.shape[0], out_features, dtype=torch.float32)
    load().quantized_matmul_vnni_packed(
        out.data_ptr(), x2.data_ptr(), packed.data_ptr(), x2.shape[0], out_features, k,
        QTYPES[qtype], torch.get_num_threads(),
    )  # fmt: skip
    return out.view(*x.shape[:-1], out_features)
