"""The decoder: one implementation of Llama, Mistral, Qwen2, Qwen3 and their mixtures of experts.

These architectures are the same transformer with small switches:

    tokens -> embed -> [ RMSNorm -> attention (RoPE, GQA, paged KV) -> + residual
                         RMSNorm -> SwiGLU MLP                      -> + residual ] x L
           -> RMSNorm -> lm_head -> logits

- Llama: no biases (unless `attention_bias`), Llama 3 RoPE scaling; Mistral: a window;
  Qwen2: q/k/v biases. Qwen3: a per-head RMSNorm on q and k before RoPE (`q_norm`, `k_norm`).
- Mixtral (Llama's attention), Qwen3-MoE (Qwen3's): a mixture of experts as the MLP (`moe.py`).

Unlike a training model, the forward pass takes a *flat* batch: `input_ids` and `positions` are
1-D over all of the step's tokens from all requests (no padding, no batch dimension). Everything
per-token (projections, norms, MLP) does not care which request a token belongs to; only
attention does, and it learns the layout from `AttentionMetadata`.

The layers are vLLM's (`linear.py`, `embedding.py`, `layernorm.py`): q, k and v are ONE matmul
(`qkv_proj`), gate and up another (`gate_up_proj`), and with tensor parallelism every layer
holds only its rank's heads, features or vocabulary rows. Parameter names are Hugging Face's
where nothing is fused (`model.layers.0.self_attn.o_proj.weight`, ...); the loader maps the
checkpoint's q_proj, k_proj, v_proj, gate_proj and up_proj into the fused ones
(`sharded_loader.py`). transformers is never used for this forward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.models.attention import AttentionMetadata
from nanovllm.models.layer_classes import LayerClasses
from nanovllm.models.model_args import ModelArgs
from nanovllm.models.rotary import RotaryEmbedding


class Attention(nn.Module):
    """Self-attention: project q, k, v (`qkv`), paged attention over the KV cache (`attn`, the
    backend's implementation of `TorchAttention`'s interface), then the output projection."""

    def __init__(self, args: ModelArgs, layers: LayerClasses) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.qkv_proj = layers.qkv(
            args.hidden_size,
            self.head_dim,
            args.num_attention_heads,
            args.num_key_value_heads,
            bias=args.qkv_bias,
        )
        # This rank's heads (all of them without tensor parallelism).
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = layers.row(
            args.num_attention_heads * self.head_dim, args.hidden_size, bias=args.o_bias
        )
        if args.qk_norm:
            self.q_norm = layers.rms_norm(self.head_dim, args.rms_norm_eps)
            self.k_norm = layers.rms_norm(self.head_dim, args.rms_norm_eps)
        self.qk_norm = args.qk_norm
        # 1/sqrt(head_dim) or Gemma's scalar; a window, soft-capping only if set (lessons': 4 args)
        scale = (args.query_pre_attn_scalar or self.head_dim) ** -0.5
        self.attn = layers.attention(
            self.num_heads, self.num_kv_heads, self.head_dim, scale, **args.attention_options()
        )

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden_size], normed
        positions: torch.Tensor,  # [num_tokens]
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],  # this layer's (key_cache, value_cache)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        q, k, v = self.qkv(x, positions, rotary)
        out = self.attn.forward(q, k, v, kv_cache[0], kv_cache[1], meta)  # [n, heads, head_dim]
        return self.o_proj(out.reshape(x.shape[0], -1))

    def qkv(
        self,
        x: torch.Tensor,  # [num_tokens, hidden_size], normed
        positions: torch.Tensor,  # [num_tokens]
        rotary: RotaryEmbedding,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projections before attention: q and k rotated, v contiguous, each
        [num_tokens, heads, head_dim]."""
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # [n, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        # v: a strided view of the fused output; the KV write needs it contiguous (RoPE copies q, k)
        v = v.reshape(n, self.num_kv_heads, self.head_dim).contiguous()
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        return q, k, v


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up as one matmul."""

    def __init__(self, args: ModelArgs, layers: LayerClasses) -> None:
        super().__init__()
        size = args.intermediate_size
        self.gate_up_proj = layers.merged_column(args.hidden_size, [size, size], bias=args.mlp_bias)
        self.down_proj = layers.row(size, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [n, intermediate / tp] each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """x + attention(norm(x)), then + MLP(norm(x)): the pre-norm residual block."""

    def __init__(self, args: ModelArgs, layers: LayerClasses) -> None:
        super().__init__()
        self.input_layernorm = layers.rms_norm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = layers.self_attn(args, layers)
        self.post_attention_layernorm = layers.rms_norm(args.hidden_size, args.rms_norm_eps)
        self.mlp = layers.moe(args, layers) if args.num_experts else MLP(args, layers)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden_size]
        positions: torch.Tensor,  # [num_tokens]
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        x = x + self.self_attn(self.input_layernorm(x), positions, rotary, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, args: ModelArgs, layers: LayerClasses) -> None:
        super().__init__()
        self.embed_tokens = layers.embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(
            layers.decoder_layer(args.for_layer(i), layers) for i in range(args.num_hidden_layers)
        )
        self.norm = layers.rms_norm(args.hidden_size, args.rms_norm_eps)


class CausalLM(nn.Module):
    """The whole model. `forward` gives hidden states; `compute_logits` the chosen rows' logits.

    `layers` are the classes its layers are built from (`model_layers.py`): the plain ones
    defined here and beside (`ModelLayers()`), or a backend's fast versions (`nanovllm/backends/`).
    """

    def __init__(
        self, args: ModelArgs, layers: LayerClasses, max_position: int | None = None
    ) -> None:
        super().__init__()
        self.args = args
        self.model = DecoderModel(args, layers)
        self.lm_head = layers.lm_head(args.vocab_size, args.hidden_size)
        self.tie_weights()
        self.rotary = layers.rotary(
            args.head_dim, max_position or args.max_position_embeddings, args.rope_parameters
        )

    def tie_weights(self) -> None:
        """With tied embeddings, the LM head *is* the embedding matrix (one tensor, not a copy)."""
        if self.args.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (key_cache, value_cache)
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        for i, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches)):
            x = layer(x, positions, self.rotary, kv_cache, meta.for_layer(i))
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [num_sampled, hidden_size] -> [num_sampled, vocab_size], in fp32 for sampling
        return self.lm_head(hidden).float()
