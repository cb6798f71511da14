"""Optional torch.compile of each layer's per-token work (`enforce_eager=False`, vLLM's name).

The idea: almost everything in a decoder layer is per token (norms, projections, RoPE, the
MLP, the residual adds), and inductor can fuse that elementwise work into a few generated
kernels instead of dozens of separate torch calls, each reading and writing the whole
activation. Paged attention is the exception: it reads the step's layout (`AttentionMetadata`,
with Python lists) and runs a custom kernel (numba on a CPU, Triton on a GPU), so it stays out
of the graphs. Each layer is compiled as two regions around it (`before_attention`: norm, q/k/v
projection, q/k norm, RoPE; `after_attention`: o-projection and residual, norm, MLP and
residual), and attention runs eagerly in between. The model is built with decoder layers of the
class `CompiledDecoderLayer` (the backend's `model_layers`), whose `forward` is the plain
`DecoderLayer.forward` cut at attention once `compile_model` has given them their regions, and
the plain one until then (or when compiling failed).

How it stays at a bounded number of compilations:
- The flat batch changes size every step, so the token dimension is marked *unbacked* dynamic
  during the warm-up: unlike a plain dynamic dimension, an unbacked one is not specialised for
  sizes 0 and 1, so one graph per region serves a single decode and a 2048-token prefill alike.
- All layers share those two graphs: parameters are graph inputs, not constants, so a guard
  checks only the layer's shape, the same for every layer. Each compiled model gets its own
  code object (`_fresh`), so engines of differently shaped models in one process each get
  their own graphs instead of filling one cache (dynamo's recompile limit is 8 per code object).
- Both regions are compiled at start-up, by a warm-up call, so no step pays for compilation and
  an inductor failure surfaces here: a machine without a C compiler (inductor's CPU backend
  builds C++) gets one warning and the eager model, never a failed step.

The packed weights (`cpu_linear.py`: MKL's, else oneDNN's) keep working: a packed tensor has no strides and
cannot enter a traced graph, so the CPU backend builds each linear layer with the class that
calls the opaque op `cpu_linear.packed_linear`, which finds the packed copy by the plain weight.

Compiling costs seconds at start-up and did not pay on the bench's decode-heavy workloads
(nanovllm/bench/README.md, "Compiling the model"): hence the default is eager.

Not compiled: the embedding, the final norm and the LM head (run once per step, not per layer),
and, running eagerly with a warning, a model under tensor parallelism (its row-parallel layers
all-reduce inside the regions), a model of its own layers (Gemma's) and one with a mixture of
experts (its tokens grouped by expert: shapes dynamo compiles again for at every step).
"""

from __future__ import annotations

import logging
import time
import types
import warnings
from collections.abc import Callable

import torch

from nanovllm.models.llama import MLP, CausalLM, DecoderLayer
from nanovllm.models.rotary import RotaryEmbedding

logger = logging.getLogger("nanovllm")

# torch.compile's backend; a test swaps in one that fails, as inductor does without a compiler.
DEFAULT_BACKEND: str | Callable = "inductor"

# Tokens in the warm-up call: any size above 1 (an unbacked dimension is not specialised to it).
WARMUP_TOKENS = 2


def _before_attention(
    layer: DecoderLayer, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Norm, q/k/v projection, (q/k norm,) RoPE: x [n, hidden] -> q, k, v [n, heads, dim]."""
    return layer.self_attn.qkv(layer.input_layernorm(x), positions, rotary)


def _after_attention(layer: DecoderLayer, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """Output projection + residual, norm, MLP + residual: -> the layer's output [n, hidden]."""
    x = x + layer.self_attn.o_proj(attn_out.reshape(x.shape[0], -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


class CompiledDecoderLayer(DecoderLayer):
    """`DecoderLayer.forward` as two compiled regions with paged attention, eager, between."""

    # (before, after), compiled: set by `compile_model`; None: not compiled, the plain forward.
    regions: tuple[Callable, Callable] | None = None

    def forward(self, x, positions, rotary, kv_cache, meta) -> torch.Tensor:
        if self.regions is None:
            return super().forward(x, positions, rotary, kv_cache, meta)
        before, after = self.regions
        q, k, v = before(self, x, positions, rotary)
        out = self.self_attn.attn.forward(q, k, v, kv_cache[0], kv_cache[1], meta)
        return after(self, x, out)


def _fresh(fn: Callable, tag: int) -> Callable:
    """`fn` with a code object of its own: dynamo keeps its compiled graphs per code object."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name)


_compiled_models = 0


def compile_model(model: CausalLM, backend: str | Callable | None = None) -> float | None:
    """Compile the two per-token regions of the model's layers (built as
    `CompiledDecoderLayer`s), give them to every layer, and warm them up.

    Returns the seconds the compilation took, or None when the model stays eager: under tensor
    parallelism, or when compiling failed (one warning that says why). `backend` is
    torch.compile's (default `DEFAULT_BACKEND`). The result is also kept as
    `model.compile_seconds`.
    """
    backend = backend or DEFAULT_BACKEND
    global _compiled_models
    model.compile_seconds = None
    layers = list(model.model.layers)
    kinds = sorted(
        {type(layer).__name__ for layer in layers if not isinstance(layer, CompiledDecoderLayer)}
    )
    if kinds:  # (a model of its own layers, Gemma's: the regions are a Llama layer's)
        warnings.warn(
            f"enforce_eager=False: this model's layers ({', '.join(kinds)}) have no compiled "
            "form; running eagerly",
            stacklevel=2,
        )
        return None
    if not all(isinstance(layer.mlp, MLP) for layer in layers):
        # (a mixture of experts groups its tokens by expert: data-dependent shapes that dynamo
        # recompiles for until its limit, so such a model is not compiled at all)
        warnings.warn(
            "enforce_eager=False: a model with mixture-of-experts layers is not compiled; "
            "running eagerly",
            stacklevel=2,
        )
        return None
    if layers[0].self_attn.o_proj.tp_size > 1:
        warnings.warn(
            "enforce_eager=False: compiling a model under tensor parallelism is not supported "
            "(its layers all-reduce inside the compiled regions); running eagerly",
            stacklevel=2,
        )
        return None
    _compiled_models += 1
    regions = (
        _fresh(_before_attention, _compiled_models),
        _fresh(_after_attention, _compiled_models),
    )
    model.compiled_regions = regions  # their code objects hold the graphs (tests count them)
    compiled = tuple(torch.compile(fn, backend=backend) for fn in regions)
    for layer in layers:
        layer.regions = compiled
    start = time.perf_counter()
    try:
        _warm_up(model)
    except Exception as exc:  # inductor's errors have no common base class to catch instead
        for layer in layers:
            layer.regions = None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        warnings.warn(
            f"enforce_eager=False: torch.compile failed ({type(exc).__name__}: {reason}); "
            "running the model eagerly (inductor's CPU backend needs a C++ compiler)",
            stacklevel=2,
        )
        return None
    model.compile_seconds = seconds = time.perf_counter() - start
    logger.info("nanovllm: compiled the model's layers in %.1f s (enforce_eager=False)", seconds)
    return seconds


def _warm_up(model: CausalLM) -> None:
    """Compile both regions now, once, with the token dimension unbacked (module docstring).

    The inputs look like a step's: the residual stream is made under inference mode (as the
    embedding makes it), positions outside it (as `prepare_inputs` builds them); a guard
    checks which, so a warm-up that differed would compile again at the first step.
    """
    weight = model.model.norm.weight
    layer = model.model.layers[0]
    attn = layer.self_attn
    n = WARMUP_TOKENS
    positions = torch.arange(n, device=weight.device)
    with torch.inference_mode():
        x = torch.randn(n, model.args.hidden_size, dtype=weight.dtype, device=weight.device)
        attn_out = torch.randn(
            n, attn.num_heads, attn.head_dim, dtype=weight.dtype, device=weight.device
        )
        for tensor in (positions, x, attn_out):
            torch._dynamo.decorators.mark_unbacked(tensor, 0)
        before, after = layer.regions
        before(layer, x, positions, model.rotary)
        after(layer, x, attn_out)
