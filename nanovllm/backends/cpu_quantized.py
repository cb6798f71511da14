"""Quantized weights on a CPU: the linear layers multiply by the GGUF blocks directly (C or numba).

Which layers a model gets is chosen once, when it is built (`cpu_quantized_layers`):

- the float32 C kernel's (`kernels/cpu_quantized_matmul_fp32.py`) where the system's C compiler
  builds it: each block decoded to float32 in the core's cache, then AVX2 FMAs in a register-
  blocked micro-kernel; the reference's arithmetic to rounding, and the fastest of the exact
  ways measured (kernels/README.md);
- else (one logged notice from its `load`) the numba kernel's (`kernels/cpu_quantized_matmul.py`),
  the same arithmetic, slower at a decode batch;
- or, with `gguf_int8_activations=True`, the int8 C kernels' (`cpu_quantized_int8.py`, x rounded
  to int8 blocks as llama.cpp does: not the reference's arithmetic any more).

The plain quantized layers (`models/quantized_linear.py`) dequantize the whole weight to
float32 for each matmul, then call `F.linear`: right, and slow, since they read the weight at 4
bytes a weight again and write it too. Here each linear layer and the LM head multiply through
a kernel that reads each block once and decodes it in the core's cache, where it applies
(float32 x on a CPU, a Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K weight, not inside torch.compile);
anything else (a weight held as float32, a compiled model) runs the reference.

A step with many rows (a long prefill) is different: there the float32 kernels of MKL or oneDNN
beat a hand-written loop. So above `KERNEL_MAX_ROWS` rows the layer dequantizes W once for the
call and uses `F.linear`, as the reference does, with W decoded by the kernel's own row decoder
(on its threads) instead of the reference's torch decoding (kernels/README.md measures both).

torch's own int8 / int4 CPU matmuls do not fit these files: `_weight_int8pack_mm` takes one
float scale per output feature (a GGUF block has one per 32 weights, so the per-block scales
would have to be folded into x, one product per block), and `_weight_int4pack_mm_for_cpu`
takes groups of 32 with a scale and a zero point in bfloat16 and its own nibble order, which
would mean rounding every float16 scale (not the file's weights any more). Both would need a
second, repacked copy, too.

Not bit-exact with the reference: both kernels decode W to the reference's floats bit for bit
but sum the products in another order than `F.linear` (tests/kernels/ hold them to rounding;
the greedy agreement on whole models is in tests/test_gguf_quantized.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanovllm.backends.cpu_quantized_int8 import INT8_QUANTIZED_CLASSES, int8_quantized_classes
from nanovllm.kernels import (
    cpu_quantized_matmul,
    cpu_quantized_matmul_fp32,
    cpu_quantized_matmul_int8,
    cpu_quantized_matmul_vnni,
)
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
    kernel=cpu_quantized_matmul,  # a kernel module: cpu_quantized_matmul(_fp32)
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: `kernel` where it applies and x has few rows; with more rows, W decoded by the
    kernel, then `F.linear`; else (another type, a compiled model) the reference."""
    if not kernel.applies(x, qweight.qtype):
        return dequantize_linear(x, qweight, bias)
    if x.numel() // x.shape[-1] > KERNEL_MAX_ROWS:  # the reference's way, decoded by the kernel
        return F.linear(x, kernel.dequantize(qweight.raw, qweight.qtype), bias)
    y = kernel.quantized_matmul(x, qweight.raw, qweight.qtype)
    return y if bias is None else y.add_(bias)


class NumbaQuantizedMatmul:
    """`matmul` through the numba kernel (mixed in before a quantized layer class); the C
    layers set `kernel` to the C kernel's module."""

    kernel = cpu_quantized_matmul

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_quantized_linear(x, self.quantized_weight(), bias, self.kernel)


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


class CQuantizedMatmul(NumbaQuantizedMatmul):
    """`matmul` through the float32 C kernel (`cpu_quantized_matmul_fp32`)."""

    kernel = cpu_quantized_matmul_fp32


class CQuantizedQKVParallelLinear(CQuantizedMatmul, QuantizedQKVParallelLinear): ...


class CQuantizedMergedColumnParallelLinear(
    CQuantizedMatmul, QuantizedMergedColumnParallelLinear
): ...


class CQuantizedRowParallelLinear(CQuantizedMatmul, QuantizedRowParallelLinear): ...


class CQuantizedParallelLMHead(CQuantizedMatmul, QuantizedParallelLMHead): ...


C_QUANTIZED_CLASSES = {
    "qkv": CQuantizedQKVParallelLinear,
    "merged_column": CQuantizedMergedColumnParallelLinear,
    "row": CQuantizedRowParallelLinear,
    "embedding": QuantizedVocabParallelEmbedding,
    "lm_head": CQuantizedParallelLMHead,
}


def exact_quantized_classes() -> dict[str, type]:
    """The layers with the reference's arithmetic this machine gets: the float32 C kernel's
    where it builds, else (one logged notice, from `cpu_quantized_matmul_fp32.load`) numba's."""
    if cpu_quantized_matmul_fp32.load() is not None:
        return C_QUANTIZED_CLASSES
    return NUMBA_QUANTIZED_CLASSES


def quantized_kernel_name(int8_activations: bool = False) -> str:
    """Which kernel `cpu_quantized_layers` gives an eager model's layers here, in words."""
    if int8_activations and cpu_quantized_matmul_int8.load() is not None:
        amx = int8_quantized_classes() is not INT8_QUANTIZED_CLASSES
        if amx:
            return "int8 C kernel (AMX)"
        if cpu_quantized_matmul_vnni.load() is not None:
            return f"int8 C kernel ({cpu_quantized_matmul_vnni.NAME})"
        return f"int8 C kernel ({cpu_quantized_matmul_int8.instruction_set()})"
    lib = cpu_quantized_matmul_fp32.load()
    if lib is not None:
        return "float32 C kernel (" + ("AVX2 FMA" if lib.has_avx2() else "plain C") + ")"
    return "numba kernel"


def cpu_quantized_layers(
    layers: ModelLayers, enforce_eager: bool, int8_activations: bool = False
) -> ModelLayers:
    """`layers` with the quantized classes, chosen once: for an eager model the float32 C
    kernel's (or numba's: `exact_quantized_classes`), or, asked for (`int8_activations`), the
    int8 C kernels' (`cpu_quantized_int8.py`: AMX's where the CPU has it, else VNNI's) where they
    could be built; for a compiled model the reference (a compiled graph cannot call C or numba;
    it traces torch code)."""
    if not enforce_eager:
        return quantized_layers(layers)
    if int8_activations and cpu_quantized_matmul_int8.load() is not None:
        return quantized_layers(layers, int8_quantized_classes())
    return quantized_layers(layers, exact_quantized_classes())
