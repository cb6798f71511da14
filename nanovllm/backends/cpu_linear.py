"""Linear layers on a CPU: each weight repacked once for oneDNN, then used by every matmul.

Almost all of a forward pass's arithmetic is y = x W^T with W a weight matrix, and a decode step
has few rows in x (one per request). torch's plain `F.linear` on a float32 CPU tensor reads W in
its checkpoint layout, [out, in] row-major; oneDNN (torch's `mkldnn` backend) can first reorder
W into the blocked layout its matmul kernels read fastest, once, and then multiply any number of
rows by it (`python -m nanovllm.bench.tools.cpu_linear` compares the two on this machine; the
figures on the team's machine are in nanovllm/bench/README.md, "What paid").

vLLM's CPU backend does the same (`dispatch_cpu_unquantized_gemm`: a oneDNN matmul handle made
once per layer; it can also free the plain weight, which we keep, see below). The CPU backend
builds the model with the packed versions of the engine's linear layers and LM head
(`packed_layers`): each is the plain class with `matmul` going through the packed copy
(`PackedMatmul`), or, in a model torch.compile will trace, through an opaque op that finds the
copy by the plain weight (`CompiledPackedMatmul`: a oneDNN-packed tensor has no strides, so it
cannot be an input of a traced graph). The packing itself runs once, after the checkpoint is
loaded (`prepack_linear_weights`, called by the CPU backend's `prepare_model`; vLLM's name for
that moment is `process_weights_after_loading`); until then, or without a packed copy, `matmul`
is `F.linear`.

Costs and limits, stated plainly:
- The packed copy sits beside the plain weight, which stays (tied embeddings read it as a
  lookup table, weight loaders and tests read it): the linear weights take twice their memory.
- The packed copy is made from the weight as it is at packing time; code that changes a weight
  afterwards must call `prepack_linear_weights` again (or `unpack_linear_weights`).
- float32 on a CPU with oneDNN only; anything else (a GPU, bfloat16) keeps `F.linear`, and so
  does a model whose weights oneDNN fails to pack (with one warning).
- Only the engine's own layer classes have packed versions: a lesson's own tensor-parallel
  layers (lesson 14) keep `F.linear`.
- The two paths sum in different orders, so they agree to rounding (tests/test_cpu_linear.py
  holds them to 1e-5 relative, 1e-4 absolute), not bit for bit; the parity tests against
  transformers run on both.
- oneDNN makes a matmul "primitive" (JIT-compiled code and its buffers) for every shape of x,
  and a serving engine's x changes shape every step (the step's token count). torch keeps them
  in two caches, oneDNN's primitive cache and ideep's, of 1,024 entries each, and each entry
  holds about 100 KB: at a steady 16 requests, 125 MB (+16%) more RSS at step 3,000 than at 500
  (`nanovllm stress --memory`, figures in nanovllm/bench/README.md). `bound_onednn_caches`
  caps both at `ONEDNN_CACHE_CAPACITY` entries, before the first primitive is made: room for
  every decode shape of a large batch, and memory that stops growing within the first steps.
  Both caps are read from the environment once, at oneDNN's first use in the process, so a
  value set there (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, `LRU_CACHE_CAPACITY`) wins, and a
  process that already ran oneDNN keeps what it had.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from nanovllm.models.embedding import ParallelLMHead
from nanovllm.models.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanovllm.models.model_layers import ModelLayers

# Each packed weight by its plain weight, for `packed_linear` (the op a compiled graph calls):
# a oneDNN-packed tensor has no strides, so it cannot be an input of a traced graph, and the
# graph passes the plain weight instead. Weak keys: an entry goes when its weight does, so a
# later tensor at the same address can never find a stale copy.
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


# Entries in each of torch's two oneDNN caches (see above); torch's default is 1,024.
ONEDNN_CACHE_CAPACITY = 256


def bound_onednn_caches(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Cap oneDNN's primitive cache and ideep's, unless the environment already sets them."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(capacity))


def can_prepack(weight: torch.Tensor) -> bool:
    """Whether `weight` [out, in] can take the oneDNN path: float32, on a CPU with oneDNN."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def linear(
    x: torch.Tensor,  # [num_tokens, in]
    weight: torch.Tensor,  # [out, in]
    bias: torch.Tensor | None,  # [out]
    packed_weight: torch.Tensor | None,  # `weight` reordered by oneDNN, or None
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: through the packed weight when there is one, else `F.linear`."""
    if packed_weight is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")


@torch.library.custom_op("nanovllm::packed_linear", mutates_args=())
def packed_linear(
    x: torch.Tensor,  # [num_tokens, in]
    weight: torch.Tensor,  # [out, in]
    bias: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [num_tokens, out]
    """`linear` for a compiled graph: one opaque op that finds `weight`'s packed copy itself.

    Without a packed copy (never packed, or another tensor than the layer's weight) it is
    `F.linear`, so its result is right either way; only its speed depends on the lookup.
    """
    return linear(x, weight, bias, _PACKED.get(weight))


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


class PackedMatmul:
    """`matmul` through the layer's oneDNN-packed weight, once `prepack_linear_weights` made it
    (mixed into a linear layer's class; `F.linear` without one)."""

    packed_weight: torch.Tensor | None = None

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return linear(x, self.weight, bias, self.packed_weight)


class CompiledPackedMatmul(PackedMatmul):
    """`matmul` as one opaque op that a compiled graph can call (`packed_linear`)."""

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return packed_linear(x, self.weight, bias)


# The engine's linear layers and LM head, packed: the plain class with the mixin's `matmul`.
class PackedQKVParallelLinear(PackedMatmul, QKVParallelLinear): ...


class PackedMergedColumnParallelLinear(PackedMatmul, MergedColumnParallelLinear): ...


class PackedRowParallelLinear(PackedMatmul, RowParallelLinear): ...


class PackedParallelLMHead(PackedMatmul, ParallelLMHead): ...


# The same, for a model torch.compile traces (`compilation.py`).
class CompiledPackedQKVParallelLinear(CompiledPackedMatmul, QKVParallelLinear): ...


class CompiledPackedMergedColumnParallelLinear(
    CompiledPackedMatmul, MergedColumnParallelLinear
): ...


class CompiledPackedRowParallelLinear(CompiledPackedMatmul, RowParallelLinear): ...


class CompiledPackedParallelLMHead(CompiledPackedMatmul, ParallelLMHead): ...


# ModelLayers field -> (plain class, packed class, packed class for a compiled model)
PACKED_CLASSES = {
    "qkv": (QKVParallelLinear, PackedQKVParallelLinear, CompiledPackedQKVParallelLinear),
    "merged_column": (
        MergedColumnParallelLinear,
        PackedMergedColumnParallelLinear,
        CompiledPackedMergedColumnParallelLinear,
    ),
    "row": (RowParallelLinear, PackedRowParallelLinear, CompiledPackedRowParallelLinear),
    "lm_head": (ParallelLMHead, PackedParallelLMHead, CompiledPackedParallelLMHead),
}


def packed_layers(layers: ModelLayers, for_compile: bool = False) -> ModelLayers:
    """`layers` with the engine's linear classes replaced by their packed versions (a class
    that is not the engine's own, such as a lesson's, stays as it is)."""
    which = 2 if for_compile else 1
    return dataclasses.replace(
        layers,
        **{
            name: classes[which]
            for name, classes in PACKED_CLASSES.items()
            if getattr(layers, name) is classes[0]
        },
    )


def linear_layers(model: nn.Module) -> list[nn.Module]:
    """The modules that multiply through `matmul`: the linear layers and the LM head."""
    return [m for m in model.modules() if callable(getattr(m, "matmul", None))]


@torch.no_grad()
def prepack_linear_weights(model: nn.Module) -> int:
    """Pack the weight of every packed-class layer for oneDNN where it can be (again, if it was
    packed before); returns how many were. If oneDNN cannot, none is (one warning)."""
    unpack_linear_weights(model)
    bound_onednn_caches()
    packed = 0
    for layer in linear_layers(model):
        if not isinstance(layer, PackedMatmul) or not can_prepack(layer.weight):
            continue
        try:
            packed_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach())
        except RuntimeError as exc:  # a oneDNN build that cannot pack here: F.linear it is
            warnings.warn(
                f"oneDNN could not prepack a linear weight ({exc}); using F.linear", stacklevel=2
            )
            unpack_linear_weights(model)
            return 0
        _PACKED[layer.weight] = layer.packed_weight = packed_weight
        packed += 1
    return packed


def unpack_linear_weights(model: nn.Module) -> None:
    """Drop the packed copies: every linear layer multiplies through `F.linear` again."""
    for layer in linear_layers(model):
        if isinstance(layer, PackedMatmul) and layer.packed_weight is not None:
            _PACKED.pop(layer.weight, None)
            layer.packed_weight = None
