"""Quantized weights on a CPU, the fast way: x quantized to 8-bit blocks, integer dot products (C).

The numba layers (`cpu_quantized.py`) decode each weight to float32 and multiply in float32;
these call `kernels/cpu_quantized_matmul_int8.py` instead, which rounds x to int8 blocks of 32
(one scale each) and sums each block's products in int32 with AVX-512 VNNI, as llama.cpp's CPU
kernels do. It reads the file's blocks as stored, like the numba kernel, and needs the
system's C compiler once (the CPU backend falls back to numba without it).

What x's rounding costs: each activation moves by up to 1/254 of its block's largest
magnitude, so the outputs differ from the reference (`dequantize_linear`) by about half a
percent of their scale, the same rounding llama.cpp applies on these files; a whole model's
greedy tokens can then part from the reference's where two logits are close.
A matmul with more than `KERNEL_MAX_ROWS` rows (a prefill) runs the reference, exactly as the
numba layers do.
"""

from __future__ import annotations

import torch

from nanovllm.kernels import cpu_quantized_matmul_int8
from nanovllm.models.quantized_linear import (
    KERNEL_MAX_ROWS,
    QuantizedMergedColumnParallelLinear,
    QuantizedParallelLMHead,
    QuantizedQKVParallelLinear,
    QuantizedRowParallelLinear,
    QuantizedVocabParallelEmbedding,
    dequantize_linear,
)


def int8_quantized_linear(
    x: torch.Tensor,  # [num_tokens, in]
    qweight,  # QuantizedTensor [out, in]
    bias: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: the int8 kernel where it applies and x has few rows, else the reference."""
    rows = x.numel() // x.shape[-1]
    if rows > KERNEL_MAX_ROWS or not cpu_quantized_matmul_int8.applies(x, qweight.qtype):
        return dequantize_linear(x, qweight, bias)
    y = cpu_quantized_matmul_int8.quantized_matmul(x, qweight.raw, qweight.qtype)
    return y if bias is None else y.add_(bias)


class Int8QuantizedMatmul:
    """`matmul` through the int8 kernel (mixed in before a quantized layer class)."""

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int8_quantized_linear(x, self.quantized_weight(), bias)


class Int8QuantizedQKVParallelLinear(Int8QuantizedMatmul, QuantizedQKVParallelLinear): ...


class Int8QuantizedMergedColumnParallelLinear(
    Int8QuantizedMatmul, QuantizedMergedColumnParallelLinear
): ...


class Int8QuantizedRowParallelLinear(Int8QuantizedMatmul, QuantizedRowParallelLinear): ...


class Int8QuantizedParallelLMHead(Int8QuantizedMatmul, QuantizedParallelLMHead): ...


INT8_QUANTIZED_CLASSES = {
    "qkv": Int8QuantizedQKVParallelLinear,
    "merged_column": Int8QuantizedMergedColumnParallelLinear,
    "row": Int8QuantizedRowParallelLinear,
    "embedding": QuantizedVocabParallelEmbedding,  # (a lookup: it dequantizes only its rows)
    "lm_head": Int8QuantizedParallelLMHead,
}
