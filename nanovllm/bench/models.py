"""Which checkpoint to benchmark: the embedded model, or a random-weight Llama built on the spot.

`--model` names one of:

- `embedded`: the model that ships in `nanovllm/default_model/`, copied to a private snapshot
  first (see `snapshot_checkpoint`). While it has not been trained yet (no
  `model.safetensors`), a random Llama of the same size (`tiny`) stands in, with a note.
- `tiny`: a ~4M-parameter random Llama (hidden 256, 4 layers, GQA 4:2, 4k vocabulary), the
  embedded model's size, where per-step overhead dominates.
- `100m`: a ~100M-parameter random Llama (hidden 768, 12 layers, GQA 12:4, 8k vocabulary), where
  the matrix multiplications dominate.
- `micro`: a ~100k-parameter one for smoke runs and tests.
- any other value: a checkpoint folder.

Random models are built with transformers (`LlamaConfig`, `save_pretrained`) into a folder under
the system temp directory, once, and reused by later runs (same spec, same seed, same bytes).
Every engine then loads the very same safetensors file. Their weights are drawn with a larger
`initializer_range` than training would use so that logits are peaked: greedy decoding on
near-flat logits would turn on float rounding and make cross-engine agreement meaningless.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

SPECS: dict[str, dict] = {
    "micro": dict(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate=128, vocab=512
    ),
    "tiny": dict(
        hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate=512, vocab=4096
    ),
    "100m": dict(
        hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate=2560, vocab=8192
    ),
}
MAX_POSITION = 1024
INIT_RANGE = {"micro": 0.2, "tiny": 0.2, "100m": 0.05}


@dataclass(frozen=True)
class ModelInfo:
    name: str  # what the user asked for
    path: Path
    num_params: int
    vocab_size: int
    max_position: int
    note: str = ""  # e.g. "embedded model not trained yet: a random stand-in"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "path": str(self.path),
            "num_params": self.num_params,
            "vocab_size": self.vocab_size,
            "max_position": self.max_position,
            "note": self.note,
        }


def cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "nanovllm-bench-models"


def resolve(spec: str) -> ModelInfo:
    """The checkpoint folder for `spec`, building a random model when needed."""
    if spec == "embedded":
        from nanovllm.engine.llm_engine import default_model_path

        path = default_model_path()
        if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
            return _info("embedded", snapshot_checkpoint(path, "embedded"))
        stand_in = resolve("tiny")
        return replace(
            stand_in,
            name="embedded",
            note="embedded model not trained yet: a ~4M random Llama stands in",
        )
    if spec in SPECS:
        return _info(spec, build_random_llama(spec))
    path = Path(spec)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"--model {spec!r}: not one of embedded, {', '.join(SPECS)}, nor a checkpoint folder"
        )
    return _info(path.name, path)


def fingerprint(path: Path) -> tuple:
    """Names, sizes and modification times of a checkpoint's files: did it change?"""
    return tuple(
        (f.name, f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(path.iterdir())
        if f.is_file() and f.suffix in (".json", ".safetensors")
    )


def snapshot_checkpoint(path: Path, name: str) -> Path:
    """A private copy of a (small) checkpoint, so every engine loads the very same bytes.

    The embedded model may be rewritten in place while a benchmark runs (its trainer saves
    checkpoints as it goes); engines loaded a minute apart would then compare different
    weights. The copy is keyed by the files' fingerprint and reused while they stay the same.
    """
    import hashlib
    import shutil

    key = hashlib.sha1(repr(fingerprint(path)).encode()).hexdigest()[:12]
    dest = cache_dir() / f"{name}-{key}"
    if (dest / ".complete").is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    for f in path.iterdir():
        if f.is_file() and f.suffix in (".json", ".safetensors", ".model", ".txt"):
            shutil.copy2(f, dest / f.name)
    (dest / ".complete").write_text("ok\n")
    return dest


def _info(name: str, path: Path) -> ModelInfo:
    from safetensors import safe_open

    from nanovllm.models.loader import weight_files

    config = json.loads((path / "config.json").read_text())
    params = 0
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                params += _numel(f, key)
    return ModelInfo(
        name=name,
        path=path,
        num_params=params,
        vocab_size=int(config["vocab_size"]),
        max_position=int(config.get("max_position_embeddings", MAX_POSITION)),
    )


def _numel(f, key: str) -> int:
    n = 1
    for d in f.get_slice(key).get_shape():
        n *= d
    return n


def build_random_llama(spec: str, seed: int = 0, root: Path | None = None) -> Path:
    """Build (once) and return the folder of the random Llama named `spec`."""
    shape = SPECS[spec]
    path = (root or cache_dir()) / f"{spec}-seed{seed}"
    if (path / ".complete").is_file():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    write_tokenizer(path, shape["vocab"])
    config = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        num_key_value_heads=shape["num_kv_heads"],
        max_position_embeddings=MAX_POSITION,
        initializer_range=INIT_RANGE[spec],
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)
    (path / ".complete").write_text("ok\n")  # a half-written folder is rebuilt next time
    return path


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer with one token per id ("<17>"): the bench feeds token ids anyway."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<0>", eos_token="<1>", pad_token="<2>"
    ).save_pretrained(path)
