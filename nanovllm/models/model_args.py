"""ModelArgs: the shape of a Llama, Qwen2 or Qwen3 model, read from its checkpoint's config.json.

The three architectures differ by a few switches (`llama.py`): biases on q/k/v (Qwen2), a norm
on q and k (Qwen3), Llama 3's RoPE scaling. Hugging Face's config names them in slightly
different ways; `from_config` reads them into one set of fields, and rejects any other
architecture by name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


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

    def for_layer(self, index: int) -> ModelArgs:
        """The arguments one layer is built from: `sliding_window` only where that layer slides."""
        slides = bool(self.layer_types) and self.layer_types[index] == "sliding_attention"
        return replace(self, sliding_window=self.sliding_window if slides else None)

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
            qk_norm=arch == "Qwen3ForCausalLM",
        )
