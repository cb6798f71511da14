"""Quantized weights packed once, at load, for the VNNI kernel: its panels kept instead of the file's rows.

The VNNI kernel (`kernels/cpu_quantized_matmul_vnni.py`) multiplies by panels of 32 output
features whose quants lie quad-major, so that one `vpdpbusd` takes 16 features at once. Called on
the file's rows, it packs every panel again in each call: a permutation of W's bytes that, at a
decode step's 32 rows, took 16-36% of the call (kernels/README.md), and at one row most of it.
Packing is the same every step, so here it runs once, when the model is ready
(`prepack_quantized_weights`, from the CPU backend's `prepare_model`; vLLM's name for that moment
is `process_weights_after_loading`), and the layers multiply by the packed panels.

The packed bytes are the file's bytes permuted (Q8_0's quants + 128), in as many bytes as W's rows
padded to a multiple of 32, so they replace the file's rows rather than sit beside them: the
weights' memory stays the file's size. A `VnniPackedTensor` therefore stands where the layer's
`QuantizedTensor` stood and answers what other code asks of one: `qtype`, `shape`, `nbytes`,
`dequantize()` (for the reference, from the bytes unpacked again) and `rows(ids)` (the token
embedding's lookup, when the LM head is tied to it and both read the one packed copy).
"""

from __future__ import annotations

import torch
from torch import nn

from nanovllm.kernels import cpu_quantized_matmul_vnni
from nanovllm.models.gguf_quants import QuantizedTensor


class VnniPackedTensor:
    """A weight [out, in] in Q8_0, Q4_0 or Q4_1 as the VNNI kernel's panels (`pack`'s bytes).

    Read-only: a model is loaded, then packed, so the weight loaders' `narrow` and `copy_` raise
    a ValueError that says so. `raw` unpacks every row (the file's layout again) for code that
    wants the file's bytes; the layers do not use it.
    """

    def __init__(self, weight: QuantizedTensor) -> None:
        self.qtype = weight.qtype
        self.shape = weight.shape
        # [panels * 32, row bytes] uint8
        self.packed = cpu_quantized_matmul_vnni.pack(weight.raw, weight.qtype)

    def narrow(self, dim: int, start: int, length: int) -> QuantizedTensor:
        raise ValueError(self._read_only("narrow"))

    def copy_(self, src: object) -> VnniPackedTensor:
        raise ValueError(self._read_only("copy_"))

    def _read_only(self, what: str) -> str:
        return (
            f"{what} on a {self.qtype} weight {tuple(self.shape)} packed for the VNNI kernel: "
            "packed weights are read-only; load the weights before the backend's prepare_model "
            "packs them"
        )

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    @property
    def raw(self) -> torch.Tensor:  # [out, row bytes] uint8, unpacked
        return self.rows(torch.arange(self.shape[0])).raw

    def rows(self, ids: torch.Tensor) -> QuantizedTensor:
        """Rows `ids` of the weight, as the file stores them."""
        raw = cpu_quantized_matmul_vnni.unpack(self.packed, self.qtype, ids)
        return QuantizedTensor(raw, self.qtype, self.shape[1])

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        return self.rows(torch.arange(self.shape[0])).dequantize()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        return cpu_quantized_matmul_vnni.quantized_matmul_packed(
            x, self.packed, self.qtype, self.shape[0]
        )


def can_pack(weight: object) -> bool:
    """Whether `weight` is a file's blocks that the VNNI kernel serves on this machine."""
    return (
        isinstance(weight, QuantizedTensor)
        and weight.qtype in cpu_quantized_matmul_vnni.QTYPES
        and isinstance(weight.raw, torch.Tensor)
        and weight.raw.device.type == "cpu"
        and cpu_quantized_matmul_vnni.load() is not None
    )


@torch.no_grad()
def prepack_quantized_weights(layers: list[nn.Module]) -> int:
    """Replace the weight of each of `layers` (or of the embedding a tied LM head reads) by its
    packed panels where the VNNI kernel serves it; returns how many were."""
    packed = 0
    for layer in layers:
        owner = layer.tied_to[0] if getattr(layer, "tied_to", ()) else layer
        if can_pack(owner.qweight):
            owner.qweight = VnniPackedTensor(owner.qweight)
            packed += 1
    return packed
