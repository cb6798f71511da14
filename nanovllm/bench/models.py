"""Which checkpoint to benchmark: the embedded model, a random-weight Llama, or a folder.

`--model` names one of:

- `embedded`: the Shakespeare model that ships in `nanovllm/default_model/` (~4M parameters);
- `micro` (~100k parameters: smoke runs and tests), `tiny` (~4M, the embedded model's size) or
  `100m` (~100M, where the matmuls dominate): random Llamas built here;
- any other value: a checkpoint folder.

Random models are built with transformers (`LlamaConfig`, `save_pretrained`) once, into a folder
under the system temp directory that later runs reuse, so every engine loads the same
safetensors file. Their weights are drawn with a larger `initializer_range` than training would
use, so logits are peaked: greedy decoding on near-flat logits would turn on float rounding and
make agreement between engines meaningless. Their tokenizer has one word per id ("<17>"); the
bench feeds token ids anyway.
"""

from __future__ import annotations

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
    if spec == "embedded":
        from nanovllm.engine.llm_engine import default_model_path

        path = default_model_path()
    elif spec in SPECS:
        path = build_random_llama(spec)
    else:
        path = Path(spec)
        if not (path / "config.json").is_file():
            raise ValueError(
                f"--model {spec!r}: not one of embedded, {', '.join(SPECS)}, nor a checkpoint folder"
            )
    return ModelInfo(spec, str(path), json.loads((path / "config.json").read_text()))


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
