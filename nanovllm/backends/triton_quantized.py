"""Quantized weights on the Triton backend: Q8_0 and Q4_0 layers multiply through the Triton dequantizing matmul.

On a GPU a decode step's matmul is bound by reading W, as on a CPU: kept as Q8_0 a weight is
8.5 bits instead of bfloat16's 16, as Q4_0 4.5. `kernels/quantized_matmul.py` reads the
blocks and decodes them tile by tile inside the kernel, never writing W out in floating
point. These layers call it for a Q8_0 or Q4_0 weight and up to `KERNEL_MAX_ROWS` rows of x
(a decode step; a long prefill is bound by arithmetic, where dequantizing once and cuBLAS
win), outside torch.compile (whose compiled regions trace the reference's torch code);
everything else (Q4_1, the K-quants, a weight held as float32) runs the reference,
`dequantize_linear`. The kernel accumulates in float32 and the result is cast to x's dtype.
On a CPU, where the Triton backend runs its kernels in Triton's interpreter, so does this one:
a correctness path (tests/test_triton_quantized.py), not a fast one.
"""

from __future__ import annotations

import torch

from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.quantized_linear import (
    KERNEL_MAX_ROWS,
    QuantizedMergedColumnParallelLinear,
    QuantizedParallelLMHead,
    QuantizedQKVParallelLinear,
    QuantizedRowParallelLinear,
    QuantizedVocabParallelEmbedding,
    dequantize_linear,
    quantized_layers,
)

KERNEL_TYPES = ("Q8_0", "Q4_0")  # the types the Triton kernel decodes


def triton_quantized_linear(
    x: torch.Tensor,  # [num_tokens, in]
    qweight,  # QuantizedTensor [out, in]
    bias: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: the Triton kernel where it applies, else the reference."""
    rows = x.numel() // x.shape[-1]
    if (
        rows > KERNEL_MAX_ROWS
        or qweight.qtype not in KERNEL_TYPES
        or torch.compiler.is_compiling()
        or not isinstance(qweight.raw, torch.Tensor)
        or qweight.raw.device != x.device
    ):
        return dequantize_linear(x, qweight, bias)
    from nanovllm.kernels.quantized_matmul import quantized_matmul

    y = quantized_matmul(x.reshape(rows, x.shape[-1]), qweight.raw, qweight.qtype)
    y = y.to(x.dtype).view(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias


class TritonQuantizedMatmul:
    """`matmul` through the Triton kernel (mixed in before a quantized layer class)."""

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return triton_quantized_linear(x, self.quantized_weight(), bias)


class TritonQuantizedQKVParallelLinear(TritonQuantizedMatmul, QuantizedQKVParallelLinear): ...


class TritonQuantizedMergedColumnParallelLinear(
    TritonQuantizedMatmul, QuantizedMergedColumnParallelLinear
): ...


class TritonQuantizedRowParallelLinear(TritonQuantizedMatmul, QuantizedRowParallelLinear): ...


class TritonQuantizedParallelLMHead(TritonQuantizedMatmul, QuantizedParallelLMHead): ...


TRITON_QUANTIZED_CLASSES = {
    "qkv": TritonQuantizedQKVParallelLinear,
    "merged_column": TritonQuantizedMergedColumnParallelLinear,
    "row": TritonQuantizedRowParallelLinear,
    "embedding": QuantizedVocabParallelEmbedding,  # (a lookup: it dequantizes only its rows)
    "lm_head": TritonQuantizedParallelLMHead,
}


def triton_quantized_layers(layers: ModelLayers) -> ModelLayers:
    """`layers` with the Triton backend's quantized classes."""
    return quantized_layers(layers, TRITON_QUANTIZED_CLASSES)
