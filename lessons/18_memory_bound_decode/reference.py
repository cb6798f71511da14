"""Lesson 18 reference: the Q8_0 block format.

`dequantize_q8_0` and `matmul_q8_0` are the engine's own: `dequantize` of
`nanovllm/models/gguf_quants.py` and `dequantize_linear` of `nanovllm/models/quantized_linear.py`
(the reference its fast kernels are tested against). The engine never quantizes: it reads
blocks that llama.cpp or the `gguf` package wrote. So `quantize_q8_0` is this lesson's own, in
torch, written to give the very bytes of `gguf.quants.quantize` (llama.cpp's
`quantize_row_q8_0_ref`, in the same float32 arithmetic).
"""

from __future__ import annotations

import torch

from nanovllm.models.gguf_quants import QuantizedTensor, dequantize
from nanovllm.models.quantized_linear import dequantize_linear

__all__ = ["quantize_q8_0", "dequantize_q8_0", "matmul_q8_0"]

BLOCK_SIZE = 32  # weights per block
BLOCK_BYTES = 2 + BLOCK_SIZE  # a float16 scale, then 32 int8


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """x float32 [rows, in] (in a multiple of 32) -> its Q8_0 blocks, uint8 [rows, in / 32 * 34]."""
    if x.dim() != 2 or x.shape[1] % BLOCK_SIZE:
        raise ValueError(
            f"quantize_q8_0 takes [rows, in] with in a multiple of {BLOCK_SIZE}: got shape "
            f"{tuple(x.shape)}"
        )
    rows = x.shape[0]
    blocks = x.to(torch.float32).reshape(rows, -1, BLOCK_SIZE)  # [rows, in / 32, 32]
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127  # [rows, in / 32, 1]
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = blocks * inverse
    # Half away from zero, as C's roundf; floor(2 * fraction) is 1 exactly when the fraction is
    # at least one half (floor(a + 0.5) is not: 0.49999997 + 0.5 rounds to 1 in float32).
    a = scaled.abs()
    whole = torch.floor(a)
    q = torch.sign(scaled) * (whole + torch.floor(2 * (a - whole)))
    scale_bytes = d.to(torch.float16).view(torch.uint8)  # [rows, in / 32, 2], little-endian
    q_bytes = q.to(torch.int8).view(torch.uint8)  # [rows, in / 32, 32]
    return torch.cat([scale_bytes, q_bytes], dim=-1).reshape(rows, -1)


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks uint8 [rows, in / 32 * 34] -> float32 [rows, in]: weight j = q_j * d."""
    return dequantize(raw, "Q8_0")


def matmul_q8_0(x: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """x float32 [num_tokens, in] times W^T, W in Q8_0 blocks [out, in / 32 * 34] -> [num_tokens, out]."""
    return dequantize_linear(x, QuantizedTensor(raw, "Q8_0", x.shape[1]), None)
