"""y = x W^T with W kept in llama.cpp's blocks, on a CPU: the numba kernel's wrapper (`cpu_quantized_matmul_numba.py`).

`applies(x, qtype)` says whether the kernel serves a product: x float32 on a CPU, W in Q8_0,
Q4_0, Q4_1, Q4_K, Q5_K or Q6_K, numba importable, outside torch.compile (which cannot trace a numba call). The
CPU backend's quantized layers ask it on each call and otherwise run the reference,
`models/quantized_linear.py`'s `dequantize_linear`, which these kernels are tested against
(`tests/kernels/test_kernel_quantized_matmul.py`). `dequantize(raw, qtype)` is the same
decoding of a whole weight into float32, for products with many rows of x.
"""

from __future__ import annotations

import functools
import importlib
import logging

import torch

from nanovllm.kernels.cpu_quantized_matmul_int8 import (  # (the same codes)
    BLOCK,
    QTYPES,
    _check,
    eager_float32_on_cpu,
)

logger = logging.getLogger("nanovllm.kernels")


@functools.cache
def _numba_kernels():
    """The numba kernel module, or None (with one logged notice) when numba cannot be imported."""
    try:
        return importlib.import_module("nanovllm.kernels.cpu_quantized_matmul_numba")
    except ImportError as e:
        logger.warning(
            "nanovllm: numba is not available (%s); quantized weights are dequantized for each "
            "matmul, which is slower. `pip install numba` for the fast path.",
            e,
        )
        return None


def applies(x: torch.Tensor, qtype: str) -> bool:
    """Whether the kernel serves x times a `qtype` weight (see the module docstring)."""
    return qtype in QTYPES and eager_float32_on_cpu(x) and _numba_kernels() is not None


def quantized_matmul(
    x: torch.Tensor,  # [num_tokens, in] float32
    raw: torch.Tensor,  # [out, in / block_size * block_bytes] uint8: the weight's blocks
    qtype: str,  # one of QTYPES
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T, W read from its blocks."""
    x2 = x.detach().reshape(-1, x.shape[-1]).contiguous()
    raw = raw.contiguous()
    _check(x2, raw, qtype)
    out = torch.empty(x2.shape[0], raw.shape[0], dtype=torch.float32)
    kernels = _numba_kernels()
    bytes_ = raw.numpy()
    kernels.quantized_matmul(
        out.numpy(), x2.numpy(), bytes_, bytes_.view("int8"), QTYPES[qtype], 32, kernels.FLOAT16
    )
    return out.view(*x.shape[:-1], raw.shape[0])


def dequantize(
    raw: torch.Tensor,  # [out, in / block_size * block_bytes] uint8
    qtype: str,  # one of QTYPES
) -> torch.Tensor:  # [out, in] float32
    """W's float32 values, decoded by the kernel's own row decoder (on numba's threads)."""
    raw = raw.contiguous()
    size, nbytes = BLOCK[qtype]
    out = torch.empty(raw.shape[0], raw.shape[1] // nbytes * size, dtype=torch.float32)
    kernels = _numba_kernels()
    bytes_ = raw.numpy()
    kernels.dequantize(out.numpy(), bytes_, bytes_.view("int8"), QTYPES[qtype], 32, kernels.FLOAT16)
    return out
