"""Tiny random-weight checkpoints for tests, built with transformers and saved to a folder.

Saving with `save_pretrained` and loading through nanovllm's own loader exercises the real
loading path (config.json, safetensors, tokenizer files) with no download.

Random models have nearly flat logits, where a greedy argmax could flip on float rounding noise.
A larger `initializer_range` makes the logits peaked, so greedy parity is a sharp test of the
computation rather than of rounding luck.

*Every* parameter is random. transformers initialises norm weights to exactly 1 and biases to
exactly 0, and with those values whole classes of bugs are invisible: a norm applied in the
wrong place (Qwen3's q/k norm after RoPE instead of before: RoPE is a rotation, and a norm with
unit weights commutes with it), a bias added twice or never. So norm weights are drawn around 1
and biases around 0, never exactly.

Within a test run both are made once: `make_model` copies a checkpoint it built before with the
same arguments, and `hf_greedy` returns the outputs it computed before for the same checkpoint
files, prompts and length. The cache is a folder of the run's (`CACHE_ENV`, set by conftest.py
and inherited by the processes a test starts, the planted-bug runs among them); without it
nothing is cached. Both are transformers' work alone, never nanovllm's, so a cached one is
exactly what a fresh one would be.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

VOCAB_SIZE = 256
# The environment variable naming the run's cache folder (see the module docstring).
CACHE_ENV = "NANOVLLM_TEST_CACHE"


TRAINING_TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n"
    "Caf\u00e9, na\u00efve, d\u00e9j\u00e0 vu \u2014 \u00ab quotes \u00bb and \u65e5\u672c\u8a9e.\n"
) * 20


def make_tokenizer_files(path: Path, kind: str = "bytelevel") -> None:
    """A tokenizer trained in milliseconds: byte-level BPE (like the embedded model's, GPT-2's,
    Llama 3's and Qwen's) or, with kind="metaspace", SentencePiece-style (Llama 2's, Mistral's).

    Ids 0 and 1 are BOS and EOS. Byte-level means any text round-trips, and one character can
    span several tokens (so the incremental detokenizer's multi-byte handling is exercised).
    Metaspace marks a word's leading space as "▁" inside the token and drops it when that token
    is the first one decoded, which is what the detokenizer's prompt context is for.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "metaspace":
        # BPE rather than Unigram: tokenizers' Unigram trainer is not deterministic run to run.
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=200, special_tokens=["<s>", "</s>", "<unk>"], show_progress=False
        )
        tok.train_from_iterator([TRAINING_TEXT], trainer)
        PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
        ).save_pretrained(path)
        return
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE + 64,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT], trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>"
    ).save_pretrained(path)


def _cache() -> Path | None:
    folder = os.environ.get(CACHE_ENV)
    return Path(folder) if folder else None


def _cached_checkpoint(build: Callable[..., Path]) -> Callable[..., Path]:
    """`build(path, ...)`, which saves a checkpoint in `path`, made once per run: a later call
    with the same arguments (but `path`) copies the folder the first one saved."""

    @functools.wraps(build)
    def make(path: Path, *args: Any, **kwargs: Any) -> Path:
        cache = _cache()
        if cache is None:
            return build(path, *args, **kwargs)
        bound = inspect.signature(build).bind(path, *args, **kwargs)
        bound.apply_defaults()
        options = {k: v for k, v in bound.arguments.items() if k != "path"}
        key = json.dumps(options, sort_keys=True, default=repr)
        saved = cache / "checkpoints" / hashlib.sha256(key.encode()).hexdigest()
        if not saved.is_dir():
            build(path, *args, **kwargs)
            _save(path, saved)
        else:
            shutil.copytree(saved, path, dirs_exist_ok=True)
        return path

    return make


def _save(folder: Path, saved: Path) -> None:
    """A copy of `folder` at `saved`, which appears whole or not at all."""
    partial = saved.with_name(f"{saved.name}.{os.getpid()}.tmp")
    shutil.copytree(folder, partial)
    try:
        partial.rename(saved)
    except OSError:  # another process saved it first
        shutil.rmtree(partial)


@_cached_checkpoint
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
    tokenizer: str = "bytelevel",
    extra: dict | None = None,
    moe: dict | None = None,
) -> Path:
    """Build, save and return the folder of a tiny random model (llama, qwen2, qwen3, mistral,
    gemma2 or gemma3: Gemma 3's text model; mixtral or qwen3_moe). `extra`: further config
    fields (a sliding window, `layer_types`, Gemma's scalars and soft-caps); `moe`: the
    mixtures' config fields over `moe_config`'s."""
    from transformers import (
        AutoModelForCausalLM,
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    path.mkdir(parents=True, exist_ok=True)
    make_tokenizer_files(path, tokenizer)
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
        config = Qwen2Config(**common, rope_theta=10000.0, **(extra or {}))
    elif arch == "qwen3":
        config = Qwen3Config(**common, rope_theta=10000.0, **(extra or {}))
    elif arch == "mistral":
        config = MistralConfig(**common, **(extra or {}))
    elif arch in ("gemma2", "gemma3"):
        common.setdefault("head_dim", hidden_size // num_heads)  # (Gemma's default is 256)
        config_class = Gemma2Config if arch == "gemma2" else Gemma3TextConfig
        config = config_class(**common, **(extra or {}))
    elif arch in ("mixtral", "qwen3_moe"):
        config = moe_config(arch, common, {**(moe or {}), **(extra or {})})
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Gemma's norms multiply by (1 + weight): their weights are centred on 0, not 1.
    randomize_defaults(model, norm_center=0.0 if arch.startswith("gemma") else 1.0)
    model.save_pretrained(path, max_shard_size="200KB" if shards else "2GB")
    return path


def moe_config(arch: str, common: dict, moe: dict):
    """A tiny Mixtral or Qwen3-MoE config: 4 experts, top-2, experts half the dense MLP's size
    (Qwen3-MoE's), over which `moe` writes its own fields."""
    from transformers import MixtralConfig, Qwen3MoeConfig

    if arch == "mixtral":
        fields = dict(num_local_experts=4, num_experts_per_tok=2, rope_theta=10000.0)
        return MixtralConfig(**{**common, **fields, **moe})
    fields = dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=common["hidden_size"],
        norm_topk_prob=False,
        rope_theta=10000.0,
    )
    return Qwen3MoeConfig(**{**common, **fields, **moe})


def randomize_defaults(model: torch.nn.Module, norm_center: float = 1.0) -> None:
    """Norm weights uniform in `norm_center` +- 0.5, biases normal with std 0.1 (see the module
    docstring)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(norm_center - 0.5, norm_center + 0.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)


def hf_greedy(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The oracle: transformers' own greedy generation, one prompt at a time, EOS ignored."""
    cache = _cache()
    if cache is None:
        return _hf_greedy(path, prompts, max_new_tokens)
    digest = hashlib.sha256(json.dumps([prompts, max_new_tokens]).encode())
    for file in sorted(Path(path).iterdir()):  # the checkpoint itself: config and weights
        if file.suffix in (".json", ".safetensors"):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    saved = cache / "hf_greedy" / f"{digest.hexdigest()}.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    outs = _hf_greedy(path, prompts, max_new_tokens)
    saved.parent.mkdir(parents=True, exist_ok=True)
    partial = saved.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(outs))
    partial.replace(saved)
    return outs


def greedy_continuation(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate` of exactly `max_new_tokens` tokens after `prompt`."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def _hf_greedy(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    outs = [greedy_continuation(model, prompt, max_new_tokens) for prompt in prompts]
    return outs


def make_draft(
    target: Path, path: Path, noise: float = 0.0, num_layers: int | None = None, seed: int = 1
) -> Path:
    """A draft model for `target` (same tokenizer and vocabulary): its first `num_layers` layers
    (`nanovllm.bench.models.layer_skip_draft`), plus Gaussian noise of `noise` times each
    tensor's own std. Close enough to the target that some of its proposals are accepted."""
    from safetensors.torch import load_file, save_file

    from nanovllm.bench.models import layer_skip_draft

    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    layer_skip_draft(target, num_layers or layers, path)
    if not noise:
        return path
    generator = torch.Generator().manual_seed(seed)
    weights = load_file(path / "model.safetensors")
    for name, tensor in weights.items():
        scale = noise * float(tensor.std()) if tensor.numel() > 1 else 0.0
        weights[name] = tensor + scale * torch.randn(tensor.shape, generator=generator)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
