"""Quantized weights on a CPU, the fast way: x quantized to 8-bit blocks, integer dot products (C).

The numba layers (`cpu_quantized.py`) decode each weight to float32 and multiply in float32;
these call `kernels/cpu_quantized_matmul_int8.py` instead, which rounds x to int8 blocks of 32
(one scale each) and sums each block's products in int32 with AVX-512 VNNI (else AVX2), as
llama.cpp's CPU kernels do. Where the CPU has AVX-512 VNNI, Q8_0, Q4_0 and Q4_1 weights go to
`kernels/cpu_quantized_matmul_vnni.py` (16 output features in each vector: same rounding, about
twice the row-by-row kernel's speed at 32 rows, kernels/README.md), at any number of rows, their
weights packed once for it when the model is ready (`prepack_int8_weights`,
`cpu_quantized_packed.py`: the same bytes, permuted, in place of the file's rows). The other
kernels read the file's blocks as stored, like the numba kernel. All need the system's C
compiler once (the CPU backend falls back to numba without it).

What x's rounding costs: each activation moves by up to 1/254 of its block's largest
magnitude, so the outputs differ from the reference (`dequantize_linear`) by about half a
percent of their scale, the same rounding llama.cpp applies on these files; a whole model's
greedy tokens can then part from the reference's where two logits are close.
A matmul with more than `KERNEL_MAX_ROWS` rows (a prefill) runs the reference, exactly as the
numba layers do, except where the VNNI kernel with 16 features a vector takes it (Q8_0, Q4_0,
Q4_1: about 0.3x dequantize + `F.linear` at 2,048 rows).

On a CPU with AMX (`amx_int8`), the same arithmetic runs on tile registers instead
(`kernels/cpu_quantized_matmul_amx.py`: 3-5x the VNNI kernel at 32 rows, kernels/README.md),
for Q8_0, Q4_0, Q4_1, Q4_K and Q5_K (Q6_K stays on VNNI), at any number of rows, a prefill's
too, where it also beats dequantizing W and MKL's float32 `F.linear`. Whether this process uses it is chosen once, when
the model is built (`int8_quantized_classes`); without AMX (one logged notice) the VNNI layers.
"""

from __future__ import annotations

import torch
from torch import nn

from nanovllm.backends.cpu_quantized_packed import VnniPackedTensor, prepack_quantized_weights
from nanovllm.kernels import (
    cpu_quantized_matmul_amx,
    cpu_quantized_matmul_int8,
    cpu_quantized_matmul_vnni,
)
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
    amx: bool = False,
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: a weight packed for the VNNI kernel (`cpu_quantized_packed.py`) through it;
    with `amx`, the AMX kernel where it applies (any number of rows); else the VNNI kernel with
    16 features a vector where it applies (Q8_0, Q4_0, Q4_1, any number of rows); else the
    row-by-row int8 kernel where it applies and x has few rows; else the reference."""
    rows = x.numel() // x.shape[-1]
    if isinstance(qweight, VnniPackedTensor) and cpu_quantized_matmul_vnni.applies(
        x, qweight.qtype
    ):
        y = qweight.matmul(x)
    elif amx and cpu_quantized_matmul_amx.applies(x, qweight.qtype):
        y = cpu_quantized_matmul_amx.quantized_matmul(x, qweight.raw, qweight.qtype)
    elif cpu_quantized_matmul_vnni.applies(x, qweight.qtype):
        y = cpu_quantized_matmul_vnni.quantized_matmul(x, qweight.raw, qweight.qtype)
    elif rows <= KERNEL_MAX_ROWS and cpu_quantized_matmul_int8.applies(x, qweight.qtype):
        y = cpu_quantized_matmul_int8.quantized_matmul(x, qweight.raw, qweight.qtype)
    else:
        return dequantize_linear(x, qweight, bias)
    return y if bias is None else y.add_(bias)


class Int8QuantizedMatmul:
    """`matmul` through the int8 kernels (mixed in before a quantized layer class); `amx`
    set in the AMX layers' classes."""

    amx = False

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int8_quantized_linear(x, self.quantized_weight(), bias, self.amx)


def prepack_int8_weights(model: nn.Module) -> int:
    """The VNNI layers' weights (not the AMX layers') packed once for the VNNI kernel where it
    serves them (`cpu_quantized_packed.py`); returns how many were."""
    layers = [m for m in model.modules() if isinstance(m, Int8QuantizedMatmul) and not m.amx]
    return prepack_quantized_weights(layers)


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


class AmxQuantizedMatmul(Int8QuantizedMatmul):
    """`matmul` through the AMX kernel where it serves the weight's type, else as the int8 layers."""

    amx = True


class AmxQuantizedQKVParallelLinear(AmxQuantizedMatmul, QuantizedQKVParallelLinear): ...


class AmxQuantizedMergedColumnParallelLinear(
    AmxQuantizedMatmul, QuantizedMergedColumnParallelLinear
): ...


class AmxQuantizedRowParallelLinear(AmxQuantizedMatmul, QuantizedRowParallelLinear): ...


class AmxQuantizedParallelLMHead(AmxQuantizedMatmul, QuantizedParallelLMHead): ...


AMX_QUANTIZED_CLASSES = {
    "qkv": AmxQuantizedQKVParallelLinear,
    "merged_column": AmxQuantizedMergedColumnParallelLinear,
    "row": AmxQuantizedRowParallelLinear,
    "embedding": QuantizedVocabParallelEmbedding,
    "lm_head": AmxQuantizedParallelLMHead,
}


def int8_quantized_classes() -> dict[str, type]:
    """The int8 layers this machine gets: the AMX ones where the AMX kernel loads (the CPU has
    `amx_int8`, the compiler builds it, Linux grants the tiles), else (one logged notice, from
    `cpu_quantized_matmul_amx.load`) the VNNI ones."""
    return (
        AMX_QUANTIZED_CLASSES
        if cpu_quantized_matmul_amx.load() is not None
        else INT8_QUANTIZED_CLASSES
    )
