"""The CPU backend ("cpu", the default on a CPU in float32): numba kernels and packed matmuls.

On a CPU a decode step is a few dozen tokens, and torch spends much of its time between its
operators rather than in them, or reading weights in a layout its matmul does not read best.
This backend builds the model from faster layers (`model_layers`, chosen once, before the model
is built), each a subclass of the plain layer with its parameters:

- paged attention: `CpuAttention`, a numba kernel that reads K/V in place through the block
  tables with an online softmax, one call for the whole step
  (`nanovllm.kernels.cpu_paged_attention`), instead of `TorchAttention`'s gathers; what it
  works out from the step's metadata alone is done once per step, by the first layer
  (`cpu_attention_plans.py`);
- RMSNorm and RoPE: one numba loop each (`nanovllm.kernels.cpu_token_ops`), keeping the plain
  layers' torch code as the fallback;
- in each decoder layer, the residual add and the norm after it as one loop, and SwiGLU's
  silu(gate) * up as one (`NumbaDecoderLayer`, vLLM's `fused_add_rms_norm` and `SiluAndMul`);
- in each attention layer, what lies between the QKV projection and paged attention (the split,
  RoPE on q and k, the K/V write into the cache) as one numba loop (`NumbaAttention`);
- a mixture of experts' tokens sorted by expert once, two grouped matmuls (`cpu_moe.py`);
- a GGUF file's quantized weights multiplied as they are stored, by numba kernels
  (`cpu_quantized.py`);
- every linear layer's matmul through a packed weight (`cpu_linear.py`: MKL's, else oneDNN's),
  packed once the weights are loaded (`prepare_model`), and so are a GGUF file's blocks for the
  VNNI int8 kernel (`cpu_quantized_packed.py`, in place of the file's layout);
- the step's inputs from a persistent batch (`input_batch.py`), equal to `step_inputs`;
- freed memory kept in the process rather than given back to the kernel and faulted in again
  (`cpu_malloc.py`: glibc's malloc thresholds, as vLLM's CPU backend preloads tcmalloc).

With `enforce_eager=False` the decoder layers are compiled instead of built with the numba
classes (inductor fuses the per-token operators itself and cannot trace a numba call); the
packed matmuls then go through an op a graph can call.

Without numba the kernels are not used: attention falls back to the torch reference and the
norms keep their torch code, with one logged notice (`nanovllm.kernels`).
"""

from __future__ import annotations

import dataclasses

import torch

from nanovllm.backends import Backend
from nanovllm.backends.cpu_attention_plans import AttentionPlans
from nanovllm.backends.cpu_linear import can_prepack, packed_layers, prepack_linear_weights
from nanovllm.backends.cpu_malloc import keep_freed_memory
from nanovllm.backends.cpu_moe import moe_layers
from nanovllm.backends.cpu_quantized import cpu_quantized_layers
from nanovllm.backends.cpu_quantized_int8 import prepack_int8_weights
from nanovllm.backends.cpu_threads import thread_governor
from nanovllm.backends.input_batch import InputBatch
from nanovllm.backends.sampler import FastSampler
from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.executor.step_inputs import StepInputs
from nanovllm.kernels import checks, cpu_token_ops
from nanovllm.kernels.cpu_paged_attention import (
    cpu_fast_path_available,
    paged_attention_cpu,
    paged_attention_cpu_planned,
)
from nanovllm.models.attention import AttentionMetadata, store_kv
from nanovllm.models.layernorm import RMSNorm
from nanovllm.models.llama import MLP, Attention, CausalLM, DecoderLayer
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.rotary import RotaryEmbedding


class CpuAttention:
    """`TorchAttention`'s interface over the in-place numba kernel (its sliding window and
    soft-capping too)."""

    plans = AttentionPlans()  # (one for every layer: a step's layers share its plan)

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        checks.check_window_and_soft_cap(sliding_window, logits_soft_cap)
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap

    def forward(self, q, k, v, key_cache, value_cache, meta: AttentionMetadata) -> torch.Tensor:
        store_kv(k, v, key_cache, value_cache, meta.slot_mapping)
        return self.attend(q, key_cache, value_cache, meta)

    def attend(self, q, key_cache, value_cache, meta: AttentionMetadata) -> torch.Tensor:
        """Paged attention over K/V already in the cache (`NumbaAttention` writes them itself),
        with the step's plan made by the first layer that attends with `meta` (`plans`)."""
        if cpu_fast_path_available(q.dtype):
            plan = self.plans.plan(meta, key_cache, q.shape[0], q.shape[1], self.sliding_window)
            return paged_attention_cpu_planned(
                q, key_cache, value_cache, plan, self.scale, logits_soft_cap=self.logits_soft_cap
            )
        return paged_attention_cpu(
            q,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            self.scale,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
        )


class NumbaRMSNorm(RMSNorm):
    """`RMSNorm` in one numba loop (its torch code for a strided input)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = cpu_token_ops.rms_norm(x, self.weight, self.eps)
        return super().forward(x) if out is None else out


class NumbaRotaryEmbedding(RotaryEmbedding):
    """`RotaryEmbedding` in one numba loop over q and k."""

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return cpu_token_ops.rotary(positions, q, k, self.cos_cached, self.sin_cached)


class NumbaAttention(Attention):
    """`Attention` with the split, RoPE and K/V write in one numba loop
    (`cpu_token_ops.rotary_and_store_kv`) and `CpuAttention`'s kernel after it. Given to models
    whose paged attention is `CpuAttention`; a layer with q/k norms (Qwen3's go between the
    split and RoPE) runs the plain `Attention.forward`. It replaces a split, a copy of v, two
    clones and two `index_copy_` (measured: nanovllm/bench/README.md, "Issue 45's target on
    SmolLM2")."""

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden_size], normed
        positions: torch.Tensor,  # [num_tokens]
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        if self.qk_norm:
            return super().forward(x, positions, rotary, kv_cache, meta)
        key_cache, value_cache = kv_cache
        q = cpu_token_ops.rotary_and_store_kv(
            self.qkv_proj(x),
            self.num_heads,
            positions,
            rotary.cos_cached,
            rotary.sin_cached,
            key_cache,
            value_cache,
            meta.slot_mapping,
        )
        out = self.attn.attend(q, key_cache, value_cache, meta)
        return self.o_proj(out.view(x.shape[0], -1))


class NumbaDecoderLayer(DecoderLayer):
    """`DecoderLayer` with the residual add and `post_attention_layernorm` in one numba loop
    (`cpu_token_ops.fused_add_rms_norm`), SwiGLU's silu(gate) * up in another
    (`cpu_token_ops.silu_and_mul`, for the plain `MLP`; a mixture of experts runs its own), and
    the last residual added in place into the MLP's output. Given with `NumbaRMSNorm` only, so
    its norms are plain RMSNorms (the same arithmetic: the sums are the plain layer's bits)."""

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden_size], contiguous
        positions: torch.Tensor,  # [num_tokens]
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        h = self.self_attn(self.input_layernorm(x), positions, rotary, kv_cache, meta)
        h = h.contiguous()  # (this layer's own tensor: the kernel adds x into it)
        norm = self.post_attention_layernorm
        normed = cpu_token_ops.fused_add_rms_norm(x.contiguous(), h, norm.weight, norm.eps)
        if type(self.mlp) is MLP:
            gate_up = self.mlp.gate_up_proj(normed).contiguous()  # [n, 2 * intermediate / tp]
            out = self.mlp.down_proj(cpu_token_ops.silu_and_mul(gate_up))
        else:
            out = self.mlp(normed)
        return out.add_(h)


def numba_layers(layers: ModelLayers, dtype: torch.dtype, device: torch.device) -> ModelLayers:
    """`layers` with the plain RMSNorm, rotary embedding, decoder layer (with the plain norms)
    and (over `CpuAttention`) attention layer replaced by their numba classes, where the kernels
    serve the model (float32 on a CPU, numba importable)."""
    if not cpu_token_ops.applies(torch.empty(0, dtype=dtype, device=device)):
        return layers
    fast = {}
    if layers.rms_norm is RMSNorm:
        fast["rms_norm"] = NumbaRMSNorm
        if layers.decoder_layer is DecoderLayer:
            fast["decoder_layer"] = NumbaDecoderLayer
    if layers.rotary is RotaryEmbedding:
        fast["rotary"] = NumbaRotaryEmbedding
    if layers.self_attn is Attention and layers.attention is CpuAttention:
        fast["self_attn"] = NumbaAttention
    return dataclasses.replace(layers, **fast)


class CpuModelRunner(ModelRunner):
    """The plain runner with the step's inputs from a persistent batch (`InputBatch`)."""

    sampler_class = FastSampler  # (the same tokens, sooner: `backends/sampler.py`)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.input_batch = InputBatch(self.block_size)
        self.governor = thread_governor()  # (fewer threads while other processes hold cores)

    def prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        return self.input_batch.prepare(out)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        if self.governor is None:
            return super().execute(out)
        self.governor.tick()
        try:
            return super().execute(out)
        finally:
            self.governor.step_ended()


class CpuBackend(Backend):
    name = "cpu"
    attention_class = CpuAttention

    def model_layers(
        self, layers: ModelLayers, dtype: torch.dtype, device: torch.device, enforce_eager: bool
    ) -> ModelLayers:
        layers = super().model_layers(layers, dtype, device, enforce_eager)
        if can_prepack(torch.empty(0, 0, dtype=dtype, device=device)):
            layers = packed_layers(layers, for_compile=not enforce_eager)
        # (F.grouped_mm cannot be traced in float32: compiled layers keep the plain MoE.)
        return moe_layers(numba_layers(layers, dtype, device)) if enforce_eager else layers

    def quantized_layers(
        self,
        layers: ModelLayers,
        dtype: torch.dtype,
        device: torch.device,
        enforce_eager: bool,
        int8_activations: bool = False,
    ) -> ModelLayers:
        return cpu_quantized_layers(layers, enforce_eager, int8_activations)

    def prepare_model(self, model: CausalLM, enforce_eager: bool = True) -> None:
        keep_freed_memory()
        prepack_linear_weights(model)
        prepack_int8_weights(model)
        super().prepare_model(model, enforce_eager)

    def runner_class(self, device: torch.device) -> type[ModelRunner]:
        return CpuModelRunner
