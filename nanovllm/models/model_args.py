"""ModelArgs: the shape of a Llama, Mistral, Qwen2, Qwen3 or Gemma 2/3 model, read from its
checkpoint's config.json.

The Llama-like architectures differ by a few switches (`llama.py`): biases on q/k/v (Qwen2), a
norm on q and k (Qwen3), Llama 3's RoPE scaling, a sliding window on some or all layers (Mistral,
Qwen2 and Qwen3 with `use_sliding_window`). Gemma 2 and 3 add what `gemma.py` describes. Hugging
Face's configs name these in slightly different ways; `from_config` reads them into one set of
fields, and rejects any other architecture, or a value nanovllm cannot honour, by name.
Mixtral (Llama's attention) and Qwen3-MoE (Qwen3's) replace the MLP of their sparse layers by
a mixture of experts (`moe.py`), read by `_moe_fields`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen3MoeForCausalLM",
)
GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
LAYER_TYPES = ("full_attention", "sliding_attention")


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
    # Attention layout and Gemma (issue 58): scores scaled by query_pre_attn_scalar ** -0.5
    # (None: head_dim ** -0.5); each attention score s becomes cap * tanh(s / cap) (Gemma 2), and
    # each final logit likewise; the sliding layers' own RoPE (Gemma 3's local base), if any.
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    rope_parameters_local: dict | None = None

    def attention_options(self) -> dict:
        """The keyword arguments of this layer's paged attention beyond the four every one takes:
        `sliding_window` and `logits_soft_cap`, each only when set (lessons' take the four)."""
        options = dict(
            sliding_window=self.sliding_window, logits_soft_cap=self.attn_logit_softcapping
        )
        return {name: value for name, value in options.items() if value is not None}

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
        check_activation(arch, config)
        rope, rope_local = rope_parameters(arch, config)
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
            tie_word_embeddings=bool(
                config.get("tie_word_embeddings", arch in GEMMA_ARCHITECTURES)
            ),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM", "Qwen3MoeForCausalLM"),
            rope_parameters_local=rope_local,
            **attention_layout(arch, config),
            **_moe_fields(arch, config),
        )


def check_activation(arch: str, config: dict) -> None:
    """The MLP's activation must be the one nanovllm computes: SiLU, or Gemma's tanh GELU."""
    field, expected = ("hidden_act", "silu")
    if arch in GEMMA_ARCHITECTURES:
        field, expected = ("hidden_activation", "gelu_pytorch_tanh")
    name = config.get(field, expected)
    if name != expected:
        raise ValueError(f"unsupported activation {field}={name!r} for {arch} ({expected!r} runs)")


def rope_parameters(arch: str, config: dict) -> tuple[dict, dict | None]:
    """The RoPE of the model's (global) layers, and the sliding layers' own where it differs:
    Gemma 3 rotates its local layers with `rope_local_base_freq` (10,000 by default) and no
    scaling, its global ones with `rope_theta` (1,000,000 by default) and `rope_scaling`. A
    config from transformers 5 holds both in `rope_parameters`, keyed by layer type."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if arch != "Gemma3ForCausalLM":
        params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
        return params, None
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full, local = params, {}
    full.setdefault("rope_theta", config.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", config.get("rope_local_base_freq", 10_000.0))
    return full, local


def attention_layout(arch: str, config: dict) -> dict:
    """The fields of `ModelArgs` that say how each layer attends: `layer_types` and
    `sliding_window`, read as transformers reads them, and Gemma's score scale and soft-caps.

    - Mistral and Mixtral: `sliding_window` on every layer (null: none); transformers' Mistral
      ignores any `layer_types`, and so does this.
    - Qwen3-MoE: with `use_sliding_window`, `sliding_window` on every layer.
    - Qwen2 and Qwen3: a window only with `use_sliding_window`, on the layers from
      `max_window_layers` on (unless `layer_types` lists them).
    - Gemma 2: `layer_types`, else sliding and full layers alternating, sliding first.
    - Gemma 3: `layer_types`, else every `sliding_window_pattern`-th layer (6th) full.
    Llama has no window; any other architecture's window is refused until it is read here. A
    layer type or window nanovllm cannot honour is a ValueError naming it.
    """
    layers = config["num_hidden_layers"]
    window = config.get("sliding_window")
    layer_types = config.get("layer_types")
    options: dict = {}
    if arch in ("MistralForCausalLM", "MixtralForCausalLM"):
        layer_types = ["sliding_attention"] * layers
    elif arch == "Qwen3MoeForCausalLM":  # (one window on every layer, when it slides at all)
        window = window if config.get("use_sliding_window") else None
        layer_types = ["sliding_attention"] * layers
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        window = window if config.get("use_sliding_window") else None
        if layer_types is None:
            first = config.get("max_window_layers", layers)
            layer_types = [
                "sliding_attention" if i >= first else "full_attention" for i in range(layers)
            ]
    elif arch in GEMMA_ARCHITECTURES:
        if config.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=True is not supported (causal only)")
        if layer_types is None:
            every = 2 if arch == "Gemma2ForCausalLM" else config.get("sliding_window_pattern", 6)
            layer_types = [
                "sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)
            ]
        options["query_pre_attn_scalar"] = config.get("query_pre_attn_scalar", 256)
        gemma2 = arch == "Gemma2ForCausalLM"  # (its defaults: transformers' Gemma2Config's)
        options["final_logit_softcapping"] = config.get(
            "final_logit_softcapping", 30.0 if gemma2 else None
        )
        # transformers' Gemma 3 never soft-caps its attention scores, whatever the config says.
        if gemma2:
            options["attn_logit_softcapping"] = config.get("attn_logit_softcapping", 50.0)
    elif window or config.get("use_sliding_window") or "sliding_attention" in (layer_types or ()):
        # (Llama has no window; an architecture added later must say how it reads its own.)
        raise ValueError(
            f"{arch} with sliding_window={window!r}: nanovllm does not read its window"
        )
    else:
        layer_types, window = None, None
    layer_types = tuple(layer_types or ())
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"unsupported layer type {unknown[0]!r} (supported: {LAYER_TYPES})")
    if layer_types and len(layer_types) != layers:
        raise ValueError(
            f"layer_types lists {len(layer_types)} layers, but num_hidden_layers is {layers}"
        )
    if "sliding_attention" not in layer_types:
        window = None
    if window is None:
        if arch in GEMMA_ARCHITECTURES and "sliding_attention" in layer_types:
            raise ValueError("sliding layers in layer_types, but sliding_window is null")
        layer_types = ()  # every layer full, as transformers runs it
    elif not (isinstance(window, int) and window > 0):
        raise ValueError(f"sliding_window must be a positive number of tokens, got {window!r}")
    for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
        value = options.get(name)
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    return dict(layer_types=layer_types, sliding_window=window, **options)


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
    else:
        fields.update(
            moe_intermediate_size=config["moe_intermediate_size"],
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
            decoder_sparse_step=config.get("decoder_sparse_step") or 1,
        )
    return fields  # (their windows: `attention_layout`)
