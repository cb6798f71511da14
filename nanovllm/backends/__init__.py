"""Backends: a platform's fast paths for the plain engine, chosen once, when the engine is built.

The plain engine (`nanovllm/models/`, `nanovllm/executor/`) is complete on its own and runs
everywhere: torch layers, paged attention in torch (`models/attention.py`), step inputs rebuilt
from Python lists. A backend may replace parts of it with faster code that computes the same
thing, at five points, and nowhere else:

- `attention_class`: each layer's paged attention (same interface as `TorchAttention`);
- `model_layers(layers, ...)`: before the model is built, the classes it is built from
  (`models/model_layers.py`): subclasses of the plain layers with the same parameters and a
  faster forward (numba RMSNorm and RoPE, packed matmuls, decoder layers compiled in two
  regions with `enforce_eager=False`);
- `quantized_layers(layers, ...)`: for a model whose weights stay quantized (a GGUF file's
  Q8_0, Q4_0, Q4_1 and the K-quants), the quantized versions of its linear layers, embedding
  and LM head (`models/quantized_linear.py`'s reference; on a CPU an int8 C kernel or numba:
  `cpu_quantized.py`; on Triton a Triton kernel: `triton_quantized.py`);
- `prepare_model(model)`: once, after the weights are loaded (vLLM's
  `process_weights_after_loading`): the packed layers pack their weights, and with
  `enforce_eager=False` the compiled layers are compiled;
- `runner_class(device)`: the `ModelRunner` subclass that runs the steps (persistent inputs,
  one copy to the GPU, CUDA graphs).

This is vLLM's `CustomOp` idea (a native forward, platform forwards chosen at construction)
spread over the places the engine has. No module changes class after it is built. `Backend`
itself is the plain one, named "torch": it changes nothing and imports no kernel. The others:

    "cpu"     cpu.py        numba attention, RMSNorm and RoPE; prepacked linears; InputBatch;
                            mixtures of experts sorted by expert, grouped matmuls (cpu_moe.py)
    "triton"  triton.py     Triton attention and KV write; on a GPU, cuda_runner.py

Each fast path is tested against the plain code it replaces (tests/test_backends.py and the
kernels' tests).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging

import torch

from nanovllm.executor.model_runner import ModelRunner
from nanovllm.models.attention import TorchAttention
from nanovllm.models.llama import CausalLM, DecoderLayer
from nanovllm.models.model_layers import ModelLayers

logger = logging.getLogger("nanovllm")


class Backend:
    """The plain backend, "torch": the plain model and runner, unchanged."""

    name = "torch"
    attention_class: type = TorchAttention

    def check_supported(self, block_size: int, head_dim: int) -> None:
        """Raise ValueError if this backend cannot run these shapes (the plain one runs all)."""

    def model_layers(
        self, layers: ModelLayers, dtype: torch.dtype, device: torch.device, enforce_eager: bool
    ) -> ModelLayers:
        """The classes to build the model from, given the engine's (or a lesson's) `layers`.
        Here: the decoder layers compiled in two regions when asked (`compilation.py`)."""
        if enforce_eager or layers.decoder_layer is not DecoderLayer:
            return layers
        from nanovllm.backends.compilation import CompiledDecoderLayer

        return dataclasses.replace(layers, decoder_layer=CompiledDecoderLayer)

    def quantized_layers(
        self,
        layers: ModelLayers,
        dtype: torch.dtype,
        device: torch.device,
        enforce_eager: bool,
        int8_activations: bool = False,
    ) -> ModelLayers:
        """The classes for a model whose weights stay quantized (a GGUF file's), given the
        ones `model_layers` chose. Here: the reference layers, dequantize then `F.linear`
        (`models/quantized_linear.py`)."""
        from nanovllm.models.quantized_linear import quantized_layers

        return quantized_layers(layers)

    def prepare_model(self, model: CausalLM, enforce_eager: bool = True) -> None:
        """Once, after the weights are loaded. Here: compile the layers, if asked."""
        if not enforce_eager:
            from nanovllm.backends.compilation import compile_model

            compile_model(model)  # on failure the model stays eager, with a warning

    def runner_class(self, device: torch.device) -> type[ModelRunner]:
        """The runner for `device`: the plain one, on every device (a GPU's runner, which stages
        the inputs and times the forward pass with events, is the Triton backend's:
        `cuda_runner.py`)."""
        return ModelRunner

    def captures_cuda_graphs(self) -> bool:
        """Whether decode steps can be replayed from CUDA graphs with this backend."""
        return False


# name -> "module:class"; imported only when chosen, so the plain backend imports no kernel.
BACKENDS = {
    "torch": "nanovllm.backends:Backend",
    "cpu": "nanovllm.backends.cpu:CpuBackend",
    "triton": "nanovllm.backends.triton:TritonBackend",
}


def get_backend(name: str) -> Backend:
    """The backend called `name` (`attention_backend`, vLLM's option)."""
    if name not in BACKENDS:
        raise ValueError(
            f"attention_backend must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}"
        )
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def pick_backend(
    requested: str | None, device: torch.device, dtype: torch.dtype = torch.float32
) -> str:
    """The backend's name: `requested`, else the fastest where we run: Triton on a GPU; on a
    CPU numba for float32 (when numba is installed; otherwise it says so once), else "torch".

    (On a CPU Triton can only run through its interpreter, thousands of times slower.)
    """
    if requested is not None:
        if requested == "cpu" and device.type != "cpu":
            raise ValueError(f"attention_backend='cpu' runs on a CPU, not on {device}")
        return requested  # (an unknown name: `get_backend` says so, naming it)
    if device.type == "cuda":
        from nanovllm.kernels.triton_setup import triton_available

        return "triton" if triton_available() else "torch"
    from nanovllm.kernels.cpu_paged_attention import cpu_fast_path_available

    return "cpu" if cpu_fast_path_available(dtype) else "torch"
