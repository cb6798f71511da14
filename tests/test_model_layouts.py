"""`ModelArgs.from_config` reads each layer's attention as transformers builds it.

The oracle is transformers' own modules, built from the same config: each attention layer's
window (`sliding_window`; Mistral's forward passes the config's to every layer), its score scale
(`scaling`) and its soft-cap, and Gemma 3's RoPE frequencies per layer type. Configs are drawn
over the fields that decide them (the window, `use_sliding_window`, `max_window_layers`,
`layer_types`, Gemma 3's `sliding_window_pattern` and its older config format), and nanovllm
reads the dict a config.json would hold. A config nanovllm cannot honour is refused, by value.
"""

from __future__ import annotations

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanovllm.models.loader import ModelLoadError, load_model_args
from nanovllm.models.model_args import ModelArgs
from nanovllm.models.rotary import compute_inv_freq

SHAPE = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)
ARCHS = ("mistral", "qwen2", "qwen3", "gemma2", "gemma3")


def hf_config(arch: str, fields: dict):
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    classes = dict(
        mistral=MistralConfig,
        qwen2=Qwen2Config,
        qwen3=Qwen3Config,
        gemma2=Gemma2Config,
        gemma3=Gemma3TextConfig,
    )
    config = classes[arch](**SHAPE, **fields)
    config.architectures = [f"{classes[arch].__name__.removesuffix('Config')}ForCausalLM"]
    if arch == "gemma3":
        config.architectures = ["Gemma3ForCausalLM"]
    return config


def hf_attention(config, index: int):
    """transformers' attention layer `index` for `config`."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention
    from transformers.models.mistral.modeling_mistral import MistralAttention
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    classes = dict(
        mistral=MistralAttention,
        qwen2=Qwen2Attention,
        qwen3=Qwen3Attention,
        gemma2=Gemma2Attention,
        gemma3=Gemma3Attention,
    )
    return classes[config.model_type.removesuffix("_text")](config, index)


@st.composite
def configs(draw) -> tuple[str, dict, dict | None]:
    """An architecture, the fields transformers' config class is built with, and, for a config
    in an older format, the fields it holds instead of `layer_types` (and Gemma 3's RoPE)."""
    arch = draw(st.sampled_from(ARCHS))
    layers = draw(st.integers(1, 7))
    window = draw(st.one_of(st.none(), st.integers(1, 40)))
    fields: dict = dict(num_hidden_layers=layers, sliding_window=window)
    if arch in ("qwen2", "qwen3"):
        fields["use_sliding_window"] = draw(st.booleans())
        fields["max_window_layers"] = draw(st.integers(0, 8))
    if arch.startswith("gemma"):
        fields["sliding_window"] = window or 4  # (a Gemma always has sliding layers)
        fields["head_dim"] = 8
        fields["query_pre_attn_scalar"] = draw(st.sampled_from([8, 24, 256]))
        fields["attn_logit_softcapping"] = draw(st.sampled_from([None, 2.0, 50.0]))
        fields["final_logit_softcapping"] = draw(st.sampled_from([None, 5.0]))
    if arch == "mistral":
        return arch, fields, None
    if draw(st.booleans()):
        layer_types = st.sampled_from(["full_attention", "sliding_attention"])
        fields["layer_types"] = draw(st.lists(layer_types, min_size=layers, max_size=layers))
        return arch, fields, None
    if not draw(st.booleans()):
        return arch, fields, None
    old: dict = {}  # an older config.json: no layer_types (transformers derives them)
    if arch == "gemma3":  # and Gemma 3's older fields, each present or absent (the default)
        choices = dict(
            sliding_window_pattern=[1, 2, 3, 7],
            rope_theta=[5e5],
            rope_local_base_freq=[2e4],
            rope_scaling=[{"rope_type": "linear", "factor": 8.0}],
        )
        for name, values in choices.items():
            value = draw(st.sampled_from([None, *values]))
            if value is not None:
                old[name] = value
    return arch, fields, old


GEMMA = dict(head_dim=8, query_pre_attn_scalar=24)


@settings(max_examples=examples(30), deadline=None)
@given(drawn=configs())
# Older configs as the Hub has them, every run: Gemma 3 with every RoPE field at its default,
# and Qwen2 deriving its layers from max_window_layers.
@example(drawn=("gemma3", dict(num_hidden_layers=7, sliding_window=4, **GEMMA), dict()))
@example(
    drawn=(
        "qwen2",
        dict(num_hidden_layers=3, sliding_window=4, use_sliding_window=True, max_window_layers=1),
        {},
    )
)
def test_each_layer_attends_as_transformers_builds_it(drawn) -> None:
    arch, fields, old = drawn
    config = hf_config(arch, fields)
    stored = config.to_dict()  # what config.json holds
    if old is not None:
        stored.pop("layer_types")
        stored.pop("_sliding_window_pattern", None)
        if arch == "gemma3":  # and its older names for its two RoPEs
            stored.pop("rope_parameters")
        stored.update(old)
        config = type(config).from_dict(stored)  # as transformers loads it
    args = ModelArgs.from_config(stored)
    for i in range(config.num_hidden_layers):
        attention = hf_attention(config, i)
        window = config.sliding_window if arch == "mistral" else attention.sliding_window
        layer = args.for_layer(i)
        assert layer.sliding_window == window, f"layer {i}"
        assert (layer.query_pre_attn_scalar or layer.head_dim) ** -0.5 == attention.scaling
        # (transformers' Gemma 3 keeps `attn_logit_softcapping` but never applies it)
        soft_cap = attention.attn_logit_softcapping if arch == "gemma2" else None
        assert layer.attention_options().get("logits_soft_cap") == soft_cap
    if arch == "gemma3":
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

        rotary = Gemma3RotaryEmbedding(config)
        for kind, params in (
            ("full_attention", args.rope_parameters),
            ("sliding_attention", args.rope_parameters_local),
        ):
            expected = getattr(rotary, f"{kind}_inv_freq", None)
            if expected is not None:
                torch.testing.assert_close(compute_inv_freq(args.head_dim, params), expected)


def gemma2(**fields) -> dict:
    config = hf_config("gemma2", dict(num_hidden_layers=2, head_dim=8)).to_dict()
    return {**config, **fields}


@pytest.mark.parametrize(
    "config, named",
    [
        (gemma2(layer_types=["sliding_attention", "chunked_attention"]), "'chunked_attention'"),
        (gemma2(layer_types=["full_attention"]), "lists 1 layers"),
        (gemma2(sliding_window=0), "got 0"),
        (gemma2(sliding_window=None), "sliding_window is null"),
        (gemma2(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (gemma2(hidden_activation="gelu"), "'gelu'"),
        (gemma2(query_pre_attn_scalar=-1), "got -1"),
        ({**gemma2(), "architectures": ["MistralForCausalLM"], "hidden_act": "relu"}, "'relu'"),
        # (an architecture whose window is not read, for one: Llama's config has no window)
        ({**gemma2(), "architectures": ["LlamaForCausalLM"]}, "sliding_window=4096"),
    ],
)
def test_a_config_nanovllm_cannot_honour_is_refused_by_value(config: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        ModelArgs.from_config(config)


def test_the_loader_names_the_file_of_a_refused_config(tmp_path) -> None:
    import json

    (tmp_path / "config.json").write_text(json.dumps(gemma2(sliding_window=-3)))
    with pytest.raises(ModelLoadError, match=r"got -3 \(in .*config\.json"):
        load_model_args(tmp_path)
