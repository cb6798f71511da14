"""Linear layers on a CPU: each weight repacked once (for MKL, or oneDNN), then used by every matmul.

Almost all of a forward pass's arithmetic is y = x W^T with W a weight matrix, and a decode step
has few rows in x (one per request). torch's plain `F.linear` on a float32 CPU tensor reads W in
its checkpoint layout, [out, in] row-major. A BLAS library can first reorder W into the blocked
layout its matmul kernels read fastest, once, and then multiply any number of rows by it. Two
libraries inside torch can: MKL (`cblas_sgemm_pack` and `cblas_sgemm_compute`, torch's
`mkl::_mkl_linear`) and oneDNN (torch's `mkldnn` backend). `python -m
nanovllm.bench.tools.cpu_linear` compares the three on this machine; the figures on the team's
machine are in nanovllm/bench/README.md ("What paid", and "MKL's packed sgemm" for the two
libraries side by side, where MKL's was 1.09-1.29x faster at 8 to 256 rows).

**MKL's packed sgemm, at any row count.** MKL packs a weight for a given m (rows of x), and
torch's op uses the packed copy only when x has exactly the m it was packed for, else it falls
back to `F.linear`. A serving engine's m changes every step. The engine packs once, for
`MKL_PACK_ROWS` rows, and tells the op each call that x has the rows it was packed for. MKL does
not document that a pack made for one m serves another. Here, the size MKL asks for did not
depend on m (SmolLM2's gate/up weight, m from 1 to 1,024), and products at 1 to 69, 200, 1,000
and 3,000 rows equalled a float64 product to a relative 1e-5 (2 threads), and agreed with it too
when packed with 1 thread and used with 2, or the reverse. So the engine checks it once per
process before it uses it (`mkl_packs_for_any_rows`: five products of a small weight, 1 to 261
rows, against `F.linear`), and packs for oneDNN instead if the check fails or torch has no MKL.
m matters to speed: packed for one row, the 30 layers of SmolLM2 took 1.3-1.4x longer at 32 rows
than packed for 32 or 256.

**Our own kernel, on a CPU that is not Intel's.** `cpu_linear_c` packs a weight into panels of
32 output features and multiplies 8 rows by a panel with its accumulators in registers; where
it builds (AVX-512) on a non-Intel CPU, `packing_library()` picks it ("c").

vLLM's CPU backend packs too (`dispatch_cpu_unquantized_gemm`: a oneDNN matmul handle made
once per layer; it can also free the plain weight, which we keep, see below). The CPU backend
builds the model with the packed versions of the engine's linear layers and LM head
(`packed_layers`): each is the plain class with `matmul` going through the packed copy
(`PackedMatmul`), or, in a model torch.compile will trace, through an opaque op that finds the
copy by the plain weight (`CompiledPackedMatmul`: a packed tensor has no strides, so it cannot
be an input of a traced graph). The packing itself runs once, after the checkpoint is loaded
(`prepack_linear_weights`, called by the CPU backend's `prepare_model`; vLLM's name for that
moment is `process_weights_after_loading`); until then, or without a packed copy, `matmul` is
`F.linear`. A packed copy remembers its library (`PackedWeight`), so that only that library's
matmul ever reads it.

Costs and limits, stated plainly:
- The packed copy sits beside the plain weight, which stays (tied embeddings read it as a
  lookup table, weight loaders and tests read it): the linear weights take twice their memory.
- The packed copy is made from the weight as it is at packing time; code that changes a weight
  afterwards must call `prepack_linear_weights` again (or `unpack_linear_weights`).
- float32 on a CPU with oneDNN only; anything else (a GPU, bfloat16) keeps `F.linear`, and so
  does a model whose weights the library fails to pack (with one warning).
- MKL asks for a packed buffer three times the weight's size (for SmolLM2's gate/up weight,
  21 MB for 7 MB) whatever m is; the pages it never writes are never touched, and the process's
  resident memory after loading SmolLM2 was the same as with oneDNN's packing (1.81 GB).
- Only the engine's own layer classes have packed versions: a lesson's own tensor-parallel
  layers (lesson 14) keep `F.linear`.
- The two paths sum in different orders, so they agree to rounding (tests/test_cpu_linear.py
  holds them to 1e-5 relative, 1e-4 absolute), not bit for bit; the parity tests against
  transformers run on both.
- (oneDNN only) oneDNN makes a matmul "primitive" (JIT-compiled code and its buffers) for every
  shape of x, and a serving engine's x changes shape every step (the step's token count). torch
  keeps them in two caches, oneDNN's primitive cache and ideep's, of 1,024 entries each, and
  each entry holds about 100 KB: at a steady 16 requests, 125 MB (+16%) more RSS at step 3,000 than at 500
  (`nanovllm stress --memory`, figures in nanovllm/bench/README.md). `bound_onednn_caches`
  caps both at `ONEDNN_CACHE_CAPACITY` entries, before the first primitive is made: room for
  every decode shape of a large batch, and memory that stops growing within the first steps.
  Both caps are read from the environment once, at oneDNN's first use in the process, so a
  value set there (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, `LRU_CACHE_CAPACITY`) wins, and a
  process that already ran oneDNN keeps what it had.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from nanovllm.kernels import cpu_linear_c
from nanovllm.models.embedding import ParallelLMHead
from nanovllm.models.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanovllm.models.model_layers import ModelLayers

# Each packed weight by its plain weight, for `packed_linear` (the op a compiled graph calls):
# a packed tensor has no strides, so it cannot be an input of a traced graph, and the
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
    """Whether `weight` [out, in] can be packed: float32, on a CPU with oneDNN (whose opaque
    tensors hold MKL's packing too)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


# Rows of x that MKL is told to expect when it packs a weight (see "MKL's packed sgemm" above).
MKL_PACK_ROWS = 256


class PackedWeight(NamedTuple):
    """A linear weight reordered once for one library's matmul kernels."""

    library: str  # "c", "mkl" or "onednn": the only library whose matmul can read `tensor`
    tensor: torch.Tensor  # the reordered copy of the weight (opaque, no strides, but for "c")


@functools.cache
def mkl_packs_for_any_rows() -> bool:
    """Whether this torch's MKL multiplies correctly, at any row count, by a weight packed for
    `MKL_PACK_ROWS` rows: a few products of a small random weight, checked against `F.linear`."""
    if not (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")):
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 24, generator=generator)  # [out, in]
    try:
        packed = pack_weight(weight, "mkl")
        for rows in (1, 3, 17, 64, MKL_PACK_ROWS + 5):
            x = torch.randn(rows, 24, generator=generator)
            y = linear(x, weight, None, packed)
            if not torch.allclose(y, F.linear(x, weight), rtol=1e-5, atol=1e-5):
                return False
    except RuntimeError:
        return False
    return True


def cpu_vendor() -> str:
    """The CPU's vendor as Linux names it (`vendor_id` in /proc/cpuinfo: "GenuineIntel",
    "AuthenticAMD"), or "" where there is no such line."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def packing_library() -> str:
    """The library that packs and multiplies on this machine: MKL on an Intel CPU where it
    passes the check above, else oneDNN. MKL picks its fastest kernels for Intel's CPUs only:
    on an AMD EPYC (Zen 4) its packed sgemm took 2.0x oneDNN's time for SmolLM2's 30 layers at
    32 rows (nanovllm/bench/README.md, "MKL's packed sgemm"). On a CPU that is not Intel's, the
    C panels kernel (`cpu_linear_c`) where it builds (AVX-512): on the same AMD EPYC it took
    0.80x oneDNN's time at 32 rows and 0.99-1.04x at 2,048 (kernels/README.md, "A C linear
    layer"); it was not measured on an Intel CPU, so there MKL or oneDNN stay."""
    if cpu_vendor() != "GenuineIntel":
        return "c" if cpu_linear_c.load() is not None else "onednn"
    return "mkl" if mkl_packs_for_any_rows() else "onednn"


def pack_weight(
    weight: torch.Tensor,  # [out, in]
    library: str,
    rows: int = MKL_PACK_ROWS,  # (MKL only) the rows of x it is packed for: see above
) -> PackedWeight:
    """`weight` reordered once for `library`'s matmul kernels."""
    if library == "c":
        return PackedWeight(library, cpu_linear_c.pack(weight))
    if library == "mkl":
        return PackedWeight(library, torch.ops.mkl._mkl_reorder_linear_weight(weight, rows))
    return PackedWeight(library, torch.ops.mkldnn._reorder_linear_weight(weight))


def linear(
    x: torch.Tensor,  # [num_tokens, in]
    weight: torch.Tensor,  # [out, in]
    bias: torch.Tensor | None,  # [out]
    packed: PackedWeight | None,  # `pack_weight(weight, ...)`, or None
) -> torch.Tensor:  # [num_tokens, out]
    """x W^T + b: through the packed weight when there is one, else `F.linear`."""
    if packed is None:
        return F.linear(x, weight, bias)
    if packed.library == "c":
        return cpu_linear_c.linear(x, packed.tensor, weight.shape[0], bias)
    if packed.library == "mkl":
        # The last argument is the row count the packing is used for: x's own (see above).
        rows = x.numel() // x.shape[-1]
        return torch.ops.mkl._mkl_linear(x, packed.tensor, weight, bias, rows)
    return torch.ops.mkldnn._linear_pointwise(x, packed.tensor, bias, "none", [], "")


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
    """`matmul` through the layer's packed weight, once `prepack_linear_weights` made it
    (mixed into a linear layer's class; `F.linear` without one)."""

    packed_weight: PackedWeight | None = None

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
    """Pack the weight of every packed-class layer where it can be (again, if it was packed
    before), for `packing_library()`; returns how many were. If the library cannot, none is (one
    warning)."""
    unpack_linear_weights(model)
    bound_onednn_caches()
    library = packing_library()
    packed = 0
    for layer in linear_layers(model):
        if not isinstance(layer, PackedMatmul) or not can_prepack(layer.weight):
            continue
        try:
            packed_weight = pack_weight(layer.weight.detach(), library)
        except RuntimeError as exc:  # a build that cannot pack here: F.linear it is
            warnings.warn(
                f"{library} could not prepack a linear weight ({exc}); using F.linear",
                stacklevel=2,
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
