"""A float32 linear layer on a CPU in C with AVX-512: y = x W^T + b, W packed once into panels
of 32 output features.

What it computes: `F.linear(x, weight, bias)` in float32, each output the sum over the input
features in order (the C file's header has the layout and the loop). `pack` is done once per
weight, when the model is loaded (`nanovllm/backends/cpu_linear.py`, library "c");
`pack_ref` is the same packing in torch and `unpack` its inverse.

Why it exists: a decode step's matmuls have a few dozen rows and read every weight from memory
once a step. oneDNN's packed matmul, which the CPU backend used for them, ran SmolLM2-135M's 30
layers at 32 rows at 144-146 GFLOP/s on this project's 2-core machine, and the plain loop here
at 179-180: 8 rows by 32 features in registers, two weight vectors and 16 FMAs per input
feature, the weights read as one sequential stream per thread (kernels/README.md, "A C linear
layer"). At 2,048 rows it took 0.99-1.04x oneDNN's time.

Built with the shared `compile_library` (`cc -O3 -march=native -fopenmp`, cached under
`~/.cache/nanovllm/`), only where the CPU lists avx512f; elsewhere, or when the build fails,
`load()` is None after one logged notice and the backend packs for oneDNN as before.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from nanovllm.kernels.cpu_quantized_matmul_int8 import _cpu_flags, build_for_cpu

SOURCE = Path(__file__).with_suffix(".c")
PANEL = 32  # output features per panel (the C file's PANEL)


def _build(cpu_flags: str) -> ctypes.CDLL | None:
    """The library built for a CPU with these /proc/cpuinfo flags; else None, with one notice."""
    lib = build_for_cpu(
        SOURCE, cpu_flags, ("avx512f",), "the C linear kernel (AVX-512)",
        "linear layers use oneDNN's packed matmul",
    )  # fmt: skip
    if lib is None:
        return None
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.linear_panels.argtypes = [pointer] * 4 + [i64] * 3 + [ctypes.c_int]
    lib.linear_panels.restype = None
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The kernel library for this machine, or None (with one notice)."""
    return _build(_cpu_flags())


def pack_ref(weight: torch.Tensor) -> torch.Tensor:  # [out, in] -> [ceil(out / 32), in, 32]
    """The panels of `weight` (float32): panels[p, k, j] = weight[32 p + j, k], 0 past `out`."""
    out_features, in_features = weight.shape
    num_panels = -(-out_features // PANEL)
    padded = weight.new_zeros(num_panels * PANEL, in_features)
    padded[:out_features] = weight
    return padded.view(num_panels, PANEL, in_features).transpose(1, 2).contiguous()


def pack(weight: torch.Tensor) -> torch.Tensor:  # [out, in] float32 -> its panels
    """`pack_ref`, checked: a float32 2-D CPU weight (a ValueError names anything else)."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(
            f"the C linear kernel packs a 2-D float32 CPU weight, not {weight.dtype} "
            f"{tuple(weight.shape)} on {weight.device}"
        )
    return pack_ref(weight.detach())


def unpack(panels: torch.Tensor, out_features: int) -> torch.Tensor:  # -> [out, in]
    """The weight the panels were packed from (pack's inverse)."""
    num_panels, in_features, _ = panels.shape
    return panels.transpose(1, 2).reshape(num_panels * PANEL, in_features)[:out_features]


def linear(
    x: torch.Tensor,  # [..., in] float32
    panels: torch.Tensor,  # `pack(weight)`: [ceil(out / 32), in, 32]
    out_features: int,
    bias: torch.Tensor | None = None,  # [out] float32
) -> torch.Tensor:  # [..., out]
    """x W^T + b through the packed panels."""
    lib = load()
    if lib is None:
        raise RuntimeError("the C linear kernel is not available here (see load())")
    in_features = panels.shape[1]
    if (
        x.dtype != torch.float32
        or x.shape[-1] != in_features
        or panels.shape[0] != -(-out_features // PANEL)
    ):
        raise ValueError(
            f"x {x.dtype} {tuple(x.shape)} does not fit panels {tuple(panels.shape)} for "
            f"{out_features} output features (float32, last dimension {in_features})"
        )
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (out_features,)):
        raise ValueError(f"bias {bias.dtype} {tuple(bias.shape)}: float32 [{out_features}]")
    rows = x.reshape(-1, in_features).contiguous()  # [M, in]
    y = torch.empty(rows.shape[0], out_features, dtype=torch.float32)
    bias = None if bias is None else bias.detach().contiguous()  # (kept alive for the call)
    lib.linear_panels(
        y.data_ptr(), rows.data_ptr(), panels.data_ptr(), None if bias is None else bias.data_ptr(),
        rows.shape[0], out_features, in_features, torch.get_num_threads(),
    )  # fmt: skip
    return y.view(*x.shape[:-1], out_features)
