"""Linear layers whose weights stay quantized in memory: a GGUF file's blocks, multiplied as they are.

Why: a decode step multiplies a few rows of activations (one per request) by every weight of
the model, so each weight byte read from memory serves a handful of multiply-adds. On a CPU the
step is bound by how fast the weights stream from memory, not by arithmetic (for SmolLM2-135M
the developers measured 39 ms of an 89 ms step in reading its float32 weights). A weight
dequantized to float32 at load is 32 bits; kept as Q8_0 it is 8.5, as Q4_0 4.5
(`gguf_quants.py` describes the block formats). Fewer bytes per step is a faster step, if the
matmul reads the blocks directly.

Each layer here is the plain layer (`linear.py`, `embedding.py`) with its weight kept as a
`QuantizedTensor` (`qweight`): bytes as the file stores them, uint8 [out, in / 32 * block_bytes].
The plain weight loaders fill it unchanged, since they only `narrow` rows (and whole blocks of
columns) and `copy_`; the parameter the loader finds by name (`weight`) is a shape on the
"meta" device, holding no memory. What the file stores in another type arrives dequantized
and is held as float32 (type "F32"), and so is a fused layer (q/k/v, gate/up) whose parts the
file stores in different types.

`matmul` here is the reference, in the plain path's style: dequantize the whole weight to
float32, then `F.linear`. It computes exactly what a model dequantized at load computes (the same
floats through the same `F.linear`), and it reads 4 bytes a weight again (and writes them), so it
is for reading and checking, not speed. A backend gives the fast versions, chosen once before
the model is built (`Backend.quantized_layers`; on a CPU, C or numba kernels on the blocks:
`backends/cpu_quantized.py`). The token embedding dequantizes only the rows it looks up.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.distributed.communication import tensor_model_parallel_all_reduce
from nanovllm.models.embedding import ParallelLMHead, VocabParallelEmbedding
from nanovllm.models.gguf_quants import QuantizedTensor
from nanovllm.models.linear import (
    LoadedWeight,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    new_parameter,
)
from nanovllm.models.model_layers import ModelLayers

# Rows of x above which a fast path's matmul gives way to `dequantize_linear`: a prefill, bound by
# arithmetic, where dequantizing W once for the call and MKL's (or cuBLAS's) float matmul win.
KERNEL_MAX_ROWS = 64


def dequantize_linear(
    x: torch.Tensor,  # [num_tokens, in]
    qweight: QuantizedTensor,  # [out, in], quantized
    bias: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: W dequantized to float32 (then x's dtype), then `F.linear`."""
    return F.linear(x, qweight.dequantize().to(x.dtype), bias)


class QuantizedWeight:
    """Mixed into a plain layer: its `weight` a meta-device shape, its values in `qweight`."""

    qweight: QuantizedTensor | None = None

    def __init__(self, *args, **kwargs) -> None:
        device = torch.empty(0).device  # where the model is being built
        with torch.device("meta"):
            super().__init__(*args, **kwargs)
        self.qweight_device = device
        self.weight.weight_loader = self.load_quantized
        if getattr(self, "bias", None) is not None:  # the bias stays a plain tensor
            with torch.device(device):
                self.bias = new_parameter(
                    *self.bias.shape, dtype=self.bias.dtype, weight_loader=self.weight_loader
                )

    def load_quantized(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: object = None
    ) -> None:
        """The plain weight loader, on `qweight`'s bytes (float32 for a dense tensor, or for a
        fused layer whose parts come in different types)."""
        if not isinstance(loaded_weight, QuantizedTensor):
            loaded_weight = QuantizedTensor.from_dense(torch.as_tensor(loaded_weight))
        if self.qweight is None:
            self.qweight = QuantizedTensor.empty(
                tuple(param.shape), loaded_weight.qtype, self.qweight_device
            )
        elif self.qweight.qtype != loaded_weight.qtype:
            if self.qweight.qtype != "F32":
                self.qweight = QuantizedTensor.from_dense(self.qweight.dequantize())
            if loaded_weight.qtype != "F32":
                loaded_weight = QuantizedTensor.from_dense(loaded_weight.dequantize())
        self.weight_loader(self.qweight, loaded_weight, shard_id)

    def quantized_weight(self) -> QuantizedTensor:
        """The weight's blocks (a tied LM head's are its embedding's)."""
        return self.qweight

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return dequantize_linear(x, self.quantized_weight(), bias)


class QuantizedQKVParallelLinear(QuantizedWeight, QKVParallelLinear): ...


class QuantizedMergedColumnParallelLinear(QuantizedWeight, MergedColumnParallelLinear): ...


class QuantizedRowParallelLinear(QuantizedWeight, RowParallelLinear): ...


class QuantizedVocabParallelEmbedding(QuantizedWeight, VocabParallelEmbedding):
    """The token embedding: the rows looked up, dequantized."""

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:  # [num_tokens] -> [num_tokens, dim]
        values = self.qweight.rows(ids).dequantize()
        return values.to(self.weight.dtype)  # (the model's dtype, as the plain table's)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.lookup(input_ids)
        mine = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        out = self.lookup(torch.where(mine, input_ids - self.vocab_start_index, 0))
        out.masked_fill_(~mine.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(out)


class QuantizedParallelLMHead(QuantizedWeight, ParallelLMHead):
    """The LM head; tied to a quantized embedding, it reads the embedding's `qweight`."""

    tied_to: tuple = ()  # (the embedding,): a tuple, so that it is not a submodule

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        if not isinstance(embed_tokens, QuantizedWeight):
            raise ValueError("a quantized LM head ties only to a quantized embedding")
        super().tie_weights(embed_tokens)
        self.tied_to = (embed_tokens,)
        return self

    def quantized_weight(self) -> QuantizedTensor:
        return self.tied_to[0].qweight if self.tied_to else self.qweight


# ModelLayers field -> its quantized class
QUANTIZED_CLASSES = {
    "qkv": QuantizedQKVParallelLinear,
    "merged_column": QuantizedMergedColumnParallelLinear,
    "row": QuantizedRowParallelLinear,
    "embedding": QuantizedVocabParallelEmbedding,
    "lm_head": QuantizedParallelLMHead,
}
PLAIN_CLASSES = {
    "qkv": QKVParallelLinear,
    "merged_column": MergedColumnParallelLinear,
    "row": RowParallelLinear,
    "embedding": VocabParallelEmbedding,
    "lm_head": ParallelLMHead,
}


def quantized_layers(layers: ModelLayers, classes: dict | None = None) -> ModelLayers:
    """`layers` with the engine's linear layers, embedding and LM head (plain, or a backend's
    subclass of them) replaced by `classes` (the reference ones by default). A class that is not
    the engine's (a lesson's own layers) stays as it is."""
    classes = classes or QUANTIZED_CLASSES
    engine_own = ("nanovllm.models.", "nanovllm.backends.")
    return dataclasses.replace(
        layers,
        **{
            name: cls
            for name, cls in classes.items()
            if isinstance(getattr(layers, name), type)
            and issubclass(getattr(layers, name), PLAIN_CLASSES[name])
            and getattr(layers, name).__module__.startswith(engine_own)
        },
    )
