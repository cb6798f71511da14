"""Tiny random-weight checkpoints for tests, built with transformers and saved to a folder.

Saving with `save_pretrained` and loading through nanovllm's own loader exercises the real
loading path (config.json, safetensors, tokenizer files) with no download.

Random models have nearly flat logits, where a greedy argmax could flip on float rounding noise.
A larger `initializer_range` makes the logits peaked, so greedy parity is a sharp test of the
computation rather than of rounding luck.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nanovllm.engine.llm_engine import default_model_path

VOCAB_SIZE = 256


def make_tokenizer_files(path: Path) -> None:
    """Copy the embedded model's tokenizer when it exists; else a byte-level one of 256 tokens."""
    src = default_model_path()
    if (src / "tokenizer.json").is_file():
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (src / name).is_file():
                (path / name).write_text((src / name).read_text())
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(VOCAB_SIZE)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<1>", bos_token="<0>").save_pretrained(path)


def make_model(
    path: Path,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    tie: bool = False,
    vocab_size: int | None = None,
    max_position: int = 512,
    seed: int = 0,
    init_range: float = 0.2,
    rope_scaling: dict | None = None,
    shards: bool = False,
) -> Path:
    """Build, save and return the folder of a tiny random model (llama, qwen2 or qwen3)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    path.mkdir(parents=True, exist_ok=True)
    make_tokenizer_files(path)
    if vocab_size is None:
        vocab_size = len(json.loads((path / "tokenizer.json").read_text())["model"]["vocab"])
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position,
        tie_word_embeddings=tie,
        initializer_range=init_range,
        bos_token_id=0,
        eos_token_id=1,
    )
    if head_dim is not None:
        common["head_dim"] = head_dim
    if arch == "llama":
        config = LlamaConfig(**common, rope_theta=10000.0, rope_scaling=rope_scaling)
    elif arch == "qwen2":
        config = Qwen2Config(**common, rope_theta=10000.0)
    elif arch == "qwen3":
        config = Qwen3Config(**common, rope_theta=10000.0)
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path, max_shard_size="200KB" if shards else "2GB")
    return path


def hf_greedy(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The oracle: transformers' own greedy generation, one prompt at a time, EOS ignored."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        outs.append(gen[0, len(prompt) :].tolist())
    return outs
