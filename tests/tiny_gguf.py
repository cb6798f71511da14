"""A tiny GGUF file, written with the `gguf` package's writer from a tiny Hugging Face checkpoint.

`write_gguf` converts a folder that `tiny_models.make_model` saved (random weights, every
parameter randomised) the way llama.cpp's `convert_hf_to_gguf.py` does for Llama (and, with no
permutation, Qwen2 and Qwen3): llama.cpp's
metadata keys, its tensor names, the rows of q and k permuted into its RoPE layout, and the
byte-level BPE tokenizer stored as a "gpt2" vocabulary with its merges. Each tensor is stored in
the type `types` gives its kind of weight ("embed", "attn", "mlp", "norm", "output"), F32 by
default, quantized with `gguf.quants.quantize`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nanovllm.bench.tools.quantized_matmul import random_blocks  # noqa: F401 (for the tests)

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)

LAYER = {
    "input_layernorm": ("attn_norm", "norm"),
    "self_attn.q_proj": ("attn_q", "attn"),
    "self_attn.k_proj": ("attn_k", "attn"),
    "self_attn.v_proj": ("attn_v", "attn"),
    "self_attn.o_proj": ("attn_output", "attn"),
    "self_attn.q_norm": ("attn_q_norm", "norm"),
    "self_attn.k_norm": ("attn_k_norm", "norm"),
    "post_attention_layernorm": ("ffn_norm", "norm"),
    "mlp.gate_proj": ("ffn_gate", "mlp"),
    "mlp.up_proj": ("ffn_up", "mlp"),
    "mlp.down_proj": ("ffn_down", "mlp"),
}
GLOBAL = {
    "model.embed_tokens": ("token_embd", "embed"),
    "model.norm": ("output_norm", "norm"),
    "lm_head": ("output", "output"),
}


def gguf_name(hf_name: str) -> tuple[str, str]:
    """llama.cpp's name for a Hugging Face tensor, and its kind (a bias: "norm", kept F32)."""
    stem, _, suffix = hf_name.rpartition(".")  # suffix: weight or bias
    if stem in GLOBAL:
        name, kind = GLOBAL[stem]
        return f"{name}.{suffix}", kind
    _, _, layer, rest = stem.split(".", 3)  # model.layers.N.rest
    name, kind = LAYER[rest]
    return f"blk.{layer}.{name}.{suffix}", "norm" if suffix == "bias" else kind


def permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's permutation of q and k rows (convert_hf_to_gguf.py's LlamaModel.permute)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    folder: Path,
    out: Path,
    types: dict[str, str] | None = None,
    architecture: str = "llama",
    chat_template: str | None = CHAT_TEMPLATE,
) -> Path:
    """Write the checkpoint in `folder` as the GGUF file `out` (see the module docstring)."""
    import gguf
    from safetensors.numpy import load_file

    types = types or {}
    config = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(str(out), architecture)
    a = architecture
    writer.add_uint32(f"{a}.block_count", config["num_hidden_layers"])
    writer.add_uint32(f"{a}.context_length", config["max_position_embeddings"])
    writer.add_uint32(f"{a}.embedding_length", config["hidden_size"])
    writer.add_uint32(f"{a}.feed_forward_length", config["intermediate_size"])
    writer.add_uint32(f"{a}.attention.head_count", config["num_attention_heads"])
    writer.add_uint32(f"{a}.attention.head_count_kv", config["num_key_value_heads"])
    writer.add_float32(f"{a}.rope.freq_base", config.get("rope_theta", 10000.0))
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_uint32(f"{a}.rope.dimension_count", head_dim)
    writer.add_uint32(f"{a}.attention.key_length", head_dim)
    writer.add_uint32(f"{a}.attention.value_length", head_dim)
    writer.add_uint32(f"{a}.vocab_size", config["vocab_size"])

    vocab = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in tokenizer["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    weights = load_file(str(folder / "model.safetensors"))
    for hf, tensor in weights.items():
        name, kind = gguf_name(hf)
        tensor = tensor.astype(np.float32)
        if architecture != "llama":  # llama.cpp permutes Llama's q and k only
            pass
        elif hf.endswith("q_proj.weight"):
            tensor = permute(tensor, config["num_attention_heads"])
        elif hf.endswith("k_proj.weight"):
            tensor = permute(tensor, config["num_key_value_heads"])
        qtype = gguf.GGMLQuantizationType[types.get(kind, "F32")]
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, tensor)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, tensor.astype(np.float16))
        else:
            try:
                data = gguf.quants.quantize(tensor, qtype)
            except NotImplementedError:  # a type the package cannot (de)quantize: zero bytes
                shape = gguf.quants.quant_shape_to_byte_shape(tensor.shape, qtype)
                data = np.zeros(shape, np.uint8)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
