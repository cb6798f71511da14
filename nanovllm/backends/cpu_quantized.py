"""Quantized weights on a CPU: the linear layers multiply by the GGUF blocks directly (numba).

Which layers a model gets is chosen once, when it is built (`cpu_quantized_layers`): these
numba ones, which compute the reference's arithmetic (to rounding), or, with
`gguf_int8_activations=True`, the int8 C kernel's (`cpu_quantized_int8.py`, x rounded to int8
blocks as llama.cpp does: the fastest measured per matmul, kernels/README.md, and not the
reference's arithmetic any more) where the system's C compiler built it.

The plain quantized layers (`models/quantized_linear.py`) dequantize the whole weight to
float32 for each matmul, then call `F.linear`: right, and slow, since they read the weight at 4
bytes a weight again and write it too. Here each linear layer and the LM head multiply through
`kernels/cpu_quantized_matmul.py`'s numba kernel, which reads each block once and decodes it in
registers, where it applies (float32 x on a CPU, a Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K
weight, not inside torch.compile); anything else (a weight held as float32, a compiled model)
runs the reference.

A step with many rows (a long prefill) is different: there the matmul is bound by arithmetic,
not by reading W, and the float32 kernels of MKL or oneDNN beat a hand-written loop by far. So
above `KERNEL_MAX_ROWS` rows the layer dequantizes W once for the call and uses `F.linear`,
as the reference does, with W decoded by the kernel's own row decoder on numba's threads instead
of the reference's torch decoding (kernels/README.md measures both).

torch's own int8 / int4 CPU matmuls do not fit these files: `_weight_int8pack_mm` takes one
float scale per output feature (a GGUF block has one per 32 weights, so the per-block scales
would have to be folded into x, one product per block), and `_weight_int4pack_mm_for_cpu`
takes groups of 32 with a scale and a zero point in bfloat16 and its own nibble order, which
would mean rounding every float16 scale (not the file's weights any more). Both would need a
second, repacked copy, too.

Not bit-exact with the reference: the kernel sums the 32-wide products in another order than
`F.linear` (tests/kernels/test_kernel_quantized_matmul.py holds them to rounding; the greedy
agreement on whole models is in tests/test_gguf_quantized.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanovllm.backends.cpu_quantized_int8 import int8_quantized_classes
from nanovllm.kernels import cpu_quantized_matmul, cpu_quantized_matmul_int8
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


def cpu_quantized_linear(
    x: torch.Tensor,  # [num_tokens, in]
    qweight,  # QuantizedTensor [out, in]
    bias: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: the numba kernel where it applies and x has few rows; with more rows, W
    decoded by the kernel, then `F.linear`; else (another type, a compiled model) the reference."""
    if not cpu_quantized_matmul.applies(x, qweight.qtype):
        return dequantize_linear(x, qweight, bias)
    if x.numel() // x.shape[-1] > KERNEL_MAX_ROWS:  # the reference's way, decoded by the kernel
        return F.linear(x, cpu_quantized_matmul.dequantize(qweight.raw, qweight.qtype), bias)
    y = cpu_quantized_matmul.quantized_matmul(x, qweight.raw, qweight.qtype)
    return y if bias is None else y.add_(bias)


class NumbaQuantizedMatmul:
    """`matmul` through the numba kernel (mixed in before a quantized layer class)."""

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_quantized_linear(x, self.quantized_weight(), bias)


class NumbaQuantizedQKVParallelLinear(NumbaQuantizedMatmul, QuantizedQKVParallelLinear): ...


class NumbaQuantizedMergedColumnParallelLinear(
    NumbaQuantizedMatmul, QuantizedMergedColumnParallelLinear
): ...


class NumbaQuantizedRowParallelLinear(NumbaQuantizedMatmul, QuantizedRowParallelLinear): ...


class NumbaQuantizedParallelLMHead(NumbaQuantizedMatmul, QuantizedParallelLMHead): ...


NUMBA_QUANTIZED_CLASSES = {
    "qkv": NumbaQuantizedQKVParallelLinear,
    "merged_column": NumbaQuantizedMergedColumnParallelLinear,
    "row": NumbaQuantizedRowParallelLinear,
    "embedding": QuantizedVocabParallelEmbedding,  # (a lookup: it dequantizes only its rows)
    "lm_head": NumbaQuantizedParallelLMHead,
}


def cpu_quantized_layers(
    layers: ModelLayers, enforce_eager: bool, int8_activations: bool = False
) -> ModelLayers:
    """`layers` with the quantized classes, chosen once: for an eager model the numba ones, or,
    asked for (`int8_activations`), the int8 C kernels' (`cpu_quantized_int8.py`: AMX's where
    the CPU has it, else VNNI's) where they could be built; for a compiled model the reference
    (a compiled graph cannot call C or numba; it traces torch code)."""
    if not enforce_eager:
        return quantized_layers(layers)
    fast = int8_activations and cpu_quantized_matmul_int8.load() is not None
    return quantized_layers(layers, int8_quantized_classes() if fast else NUMBA_QUANTIZED_CLASSES)
