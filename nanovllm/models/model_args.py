"""ModelArgs: the shape of a Llama, Qwen2 or Qwen3 model, read from its checkpoint's config.json.

The three architectures differ by a few switches (`llama.py`): biases on q/k/v (Qwen2), a norm
on q and k (Qwen3), Llama 3's RoPE scaling. Hugging Face's config names them in slightly
different ways; `from_config` reads them into one set of fields, and rejects any other
architecture by name. Mixtral (Llama's attention) and Qwen3-MoE (Qwen3's) replace the MLP of
their sparse layers by a mixture of experts (`moe.py`), read by `_moe_fields`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen3MoeForCausalLM",
)


@dataclass
class ModelArgs:
    """The shape of the model, read from a checkpoint's config.json."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_parameters: dict
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    # Per layer, Hugging Face's names: "full_attention" or "sliding_attention" (empty: all full).
    layer_types: tuple[str, ...] = ()
    # The window of the sliding layers, in tokens (a query sees itself and the W - 1 before it).
    sliding_window: int | None = None
    # Mixture of experts (`moe.py`; Mixtral, Qwen3-MoE). num_experts 0: every MLP is dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k: the experts each token is routed to
    moe_intermediate_size: int = 0  # each expert's SwiGLU size (`intermediate_size`: dense ones)
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1
    mlp_only_layers: tuple[int, ...] = ()  # layers that keep a dense MLP (Qwen3-MoE)
    decoder_sparse_step: int = 1  # every step-th layer is sparse (Qwen3-MoE)

    def for_layer(self, index: int) -> ModelArgs:
        """The arguments one layer is built from: `sliding_window` only where that layer slides,
        `num_experts` only where its MLP is a mixture of experts."""
        slides = bool(self.layer_types) and self.layer_types[index] == "sliding_attention"
        return replace(
            self,
            sliding_window=self.sliding_window if slides else None,
            num_experts=self.num_experts if self.is_moe_layer(index) else 0,
        )

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index`'s MLP is a mixture of experts (Qwen3-MoE's rule; Mixtral's
        config has neither `mlp_only_layers` nor `decoder_sparse_step`, so all of its are)."""
        return (
            self.num_experts > 0
            and index not in self.mlp_only_layers
            and (index + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_config(cls, config: dict) -> ModelArgs:
        archs = config.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs!r}: nanovllm runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        hidden = config["hidden_size"]
        heads = config["num_attention_heads"]
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
        attention_bias = bool(config.get("attention_bias", False))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            rope_parameters=rope,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            **_moe_fields(arch, config),
        )


def _moe_fields(arch: str, config: dict) -> dict:
    """The mixture-of-experts fields of Mixtral's and Qwen3-MoE's config.json (none for a
    dense architecture). Their routers differ in one switch: Mixtral always renormalises the
    top-k weights; Qwen3-MoE only with `norm_topk_prob`."""
    if arch not in ("MixtralForCausalLM", "Qwen3MoeForCausalLM"):
        return {}
    # (transformers' save_pretrained writes Qwen3-MoE's num_experts as num_local_experts.)
    num_experts = config.get("num_experts") or config.get("num_local_experts")
    top_k = config.get("num_experts_per_tok")
    if not num_experts or not top_k or not 0 < top_k <= num_experts:
        raise ValueError(
            f"{arch}: num_experts={num_experts!r} and num_experts_per_tok={top_k!r} must be "
            "positive, with num_experts_per_tok <= num_experts"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{arch}: hidden_act={config['hidden_act']!r}; nanovllm runs 'silu'")
    fields = dict(num_experts=num_experts, num_experts_per_tok=top_k)
    if arch == "MixtralForCausalLM":
        fields.update(moe_intermediate_size=config["intermediate_size"], norm_topk_prob=True)
        window = config.get("sliding_window")
    else:
        fields.update(
            moe_intermediate_size=config["moe_intermediate_size"],
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
            decoder_sparse_step=config.get("decoder_sparse_step") or 1,
        )
        window = config.get("sliding_window") if config.get("use_sliding_window") else None
    if window:  # (both slide on every layer when they slide at all)
        fields.update(
            sliding_window=window,
            layer_types=("sliding_attention",) * config["num_hidden_layers"],
        )
    return fields
