"""Gemma 2 and Gemma 3 (text): Llama's decoder (`llama.py`) with Google's changes.

The same flat batch, paged attention, fused projections and parallel layers as Llama; what
differs, and why:

    tokens -> embed * sqrt(hidden) -> [ norm -> attention -> norm -> + residual
                                        norm -> GeGLU MLP -> norm -> + residual ] x L
           -> norm -> lm_head (tied) -> (soft-capped) logits

- RMSNorm multiplies by (1 + weight), not weight: the weights are stored centred on 0. It is a
  class of its own (`GemmaRMSNorm`), never a backend's Llama-shaped norm.
- The embedding is scaled by sqrt(hidden_size), in the model's dtype as transformers does (in
  bfloat16 sqrt(3072) = 55.43 becomes 55.5), so a tied LM head reads the unscaled table.
- Four norms a layer: after attention and after the MLP too, each before its residual add,
  which keeps the residual stream's scale in check.
- The MLP's gate is GELU (tanh approximation) instead of SiLU.
- Scores are scaled by 1/sqrt(query_pre_attn_scalar), a number of the config's, not by
  1/sqrt(head_dim).
- Local and global layers alternate (`layer_types`): a sliding layer attends to the last
  `sliding_window` tokens only (Gemma 2: every other layer; Gemma 3: five of every six), so most
  layers' attention costs stay flat however long the context grows.
- Gemma 2 soft-caps each attention score and each final logit, s -> cap * tanh(s / cap), so that
  no score can grow without bound.
- Gemma 3 norms q and k per head before RoPE (as Qwen3 does), and rotates its local layers with
  a RoPE base of their own (`rope_local_base_freq`, 10,000) while its global layers keep a base
  of 1,000,000, possibly scaled for long contexts.

The rest is Llama's: `Attention` (built with Gemma's norm for q and k, its scale, window and
cap come from `ModelArgs`), the paged attention the backend gives, the fused linear layers, the
embedding and LM head. Parameter names are transformers' (`pre_feedforward_layernorm`, ...).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.models.attention import AttentionMetadata
from nanovllm.models.layer_classes import LayerClasses
from nanovllm.models.llama import MLP, Attention, CausalLM
from nanovllm.models.model_args import ModelArgs
from nanovllm.models.rotary import RotaryEmbedding


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), all in fp32, cast back at the end (transformers' order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).to(x.dtype)


class GemmaMLP(MLP):
    """GeGLU: down(gelu_tanh(gate(x)) * up(x)), with gate and up as one matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [n, intermediate / tp] each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    """x + norm(attention(norm(x))), then + norm(MLP(norm(x))): a norm on both sides of each."""

    def __init__(self, args: ModelArgs, layers: LayerClasses) -> None:
        super().__init__()
        norm = (args.hidden_size, args.rms_norm_eps)
        self.input_layernorm = GemmaRMSNorm(*norm)
        self.self_attn = layers.self_attn(args, layers)
        self.post_attention_layernorm = GemmaRMSNorm(*norm)
        self.pre_feedforward_layernorm = GemmaRMSNorm(*norm)
        self.mlp = GemmaMLP(args, layers)
        self.post_feedforward_layernorm = GemmaRMSNorm(*norm)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden_size]
        positions: torch.Tensor,  # [num_tokens]
        rotary: RotaryEmbedding,  # this layer's: local or global
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        attn = self.self_attn(self.input_layernorm(x), positions, rotary, kv_cache, meta)
        x = x + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(mlp)


def gemma_layers(layers: LayerClasses) -> LayerClasses:
    """`layers` with Gemma's norm and decoder layer, and the plain attention layer around the
    given paged attention: a backend's own versions of these are Llama's (a Llama RMSNorm, a
    fused attention layer without Gemma's q/k norm), and would compute something else."""
    return dataclasses.replace(
        layers, rms_norm=GemmaRMSNorm, self_attn=Attention, decoder_layer=GemmaDecoderLayer
    )


class GemmaForCausalLM(CausalLM):
    """Gemma 2 or 3: `CausalLM` built from Gemma's layers, with the embedding scale, a RoPE per
    layer type and the final soft-cap (see the module docstring)."""

    def __init__(
        self, args: ModelArgs, layers: LayerClasses, max_position: int | None = None
    ) -> None:
        super().__init__(args, gemma_layers(layers), max_position)
        # sqrt(hidden_size) as transformers keeps it: an fp32 scalar, cast to the model's dtype.
        scale = torch.tensor(args.hidden_size**0.5, dtype=torch.float32)
        self.register_buffer("embed_scale", scale, persistent=False)
        self.local_rotary = self.rotary
        if args.rope_parameters_local is not None:
            max_position = max_position or args.max_position_embeddings
            self.local_rotary = layers.rotary(
                args.head_dim, max_position, args.rope_parameters_local
            )
        # Each layer's RoPE, by its type.
        self.layer_rotary = [
            self.local_rotary if args.for_layer(i).sliding_window else self.rotary
            for i in range(args.num_hidden_layers)
        ]

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        x = x * self.embed_scale.to(x.dtype)
        for i, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches)):
            x = layer(x, positions, self.layer_rotary[i], kv_cache, meta.for_layer(i))
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)  # [num_sampled, vocab_size], fp32
        cap = self.args.final_logit_softcapping
        return logits if cap is None else cap * torch.tanh(logits / cap)
