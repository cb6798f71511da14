"""What the demos share: a model to run, a quickly built engine, a place for figures.

A demo must run in seconds on a laptop CPU, from a fresh install, offline. So it runs the
embedded default model when the package has it, and otherwise a tiny random Llama (2 layers,
hidden size 64) that is built once, in about a second, into `$NANOVLLM_HOME/models/`. A random
model writes nonsense, but every mechanism the lessons show (blocks, scheduling, preemption,
prefix hits, chunks, streaming) works exactly the same: they do not care what the text says.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from nanovllm.lessons.workspace import home

TINY_MODEL_NAME = "tiny-random-llama"

# Public-domain text (Shakespeare, Sonnets 18 and 116) to learn the tiny tokenizer's merges from,
# so that its tokens look like the pieces of words a real tokenizer makes.
_TOKENIZER_TEXT = """\
Shall I compare thee to a summer's day? Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May, And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines, And often is his gold complexion dimm'd;
And every fair from fair sometime declines, By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade, Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade, When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see, So long lives this, and this gives life to thee.
Let me not to the marriage of true minds Admit impediments. Love is not love
Which alters when it alteration finds, Or bends with the remover to remove.
O no! it is an ever-fixed mark That looks on tempests and is never shaken;
It is the star to every wand'ring bark, Whose worth's unknown, although his height be taken.
ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is the sun.
JULIET: O Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name.
"""


def make_console(**kwargs) -> Console:
    return Console(highlight=False, **kwargs)


def section(console: Console, title: str) -> None:
    console.print()
    console.print(Rule(f"[bold]{title}"))


def figures_dir() -> Path:
    path = home() / "lessons" / "figures"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- a model to run -----------------------------------------------------------------------------


def default_model_ready() -> bool:
    from nanovllm.engine.setup import default_model_path

    path = default_model_path()
    return (
        all((path / name).is_file() for name in ("config.json", "model.safetensors"))
        and (path / "tokenizer.json").is_file()
    )


def demo_model_path() -> Path:
    """The default model if the package has it, else the tiny random one (built on first use)."""
    if default_model_ready():
        from nanovllm.engine.setup import default_model_path

        return default_model_path()
    path = home() / "models" / TINY_MODEL_NAME
    if not (path / "model.safetensors").is_file():
        build_tiny_model(path)
    return path


def windowed_model_path(sliding_window: int) -> Path:
    """The demo model as Mistral reads it: the same weights and tokenizer, every layer's
    attention a window of `sliding_window` tokens (a Mistral checkpoint is a Llama one with a
    window), so its KV cache group is a sliding one (lesson 16). Written once, beside the tiny
    model, its files links to the demo model's."""
    source = demo_model_path()
    config = json.loads((source / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral",
                  sliding_window=sliding_window)  # fmt: skip
    return _derived_model(source, f"window-{sliding_window}", config)


def moe_model_path(num_experts: int = 4, top_k: int = 2, seed: int = 0) -> Path:
    """The demo model as a mixture of experts (Mixtral, lesson 17): the same attention,
    embeddings, norms and tokenizer; each layer's MLP cut into `num_experts` experts along its
    intermediate dimension (expert e: rows e*I/E .. (e+1)*I/E of gate and up, those columns of
    down, scaled by E / top_k, as a token's `top_k` weights sum to 1), and a random router
    (seeded by `seed`) choosing `top_k` of them per token. A cut model, not a trained one: it
    writes worse text than the demo model, but routes every token as a trained one would.
    Written once, beside the tiny model: its weights a file of their own, the rest links."""
    import torch
    from safetensors.torch import load_file

    source = demo_model_path()
    config = json.loads((source / "config.json").read_text())
    inter = config["intermediate_size"]
    if inter % num_experts:
        raise ValueError(f"{source}: intermediate_size {inter} is not a multiple of {num_experts}")
    n = inter // num_experts
    config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                  num_local_experts=num_experts, num_experts_per_tok=top_k,
                  intermediate_size=n)  # fmt: skip

    def weights() -> dict[str, torch.Tensor]:
        dense = load_file(str(source / "model.safetensors"))
        gen = torch.Generator().manual_seed(seed)
        tensors = {name: value for name, value in dense.items() if ".mlp." not in name}
        for layer in range(config["num_hidden_layers"]):
            mlp = f"model.layers.{layer}.mlp"
            gate, up = dense[f"{mlp}.gate_proj.weight"], dense[f"{mlp}.up_proj.weight"]
            down = dense[f"{mlp}.down_proj.weight"] * (num_experts / top_k)
            moe = f"model.layers.{layer}.block_sparse_moe"
            for e in range(num_experts):
                rows = slice(e * n, (e + 1) * n)
                tensors[f"{moe}.experts.{e}.w1.weight"] = gate[rows].contiguous()
                tensors[f"{moe}.experts.{e}.w3.weight"] = up[rows].contiguous()
                tensors[f"{moe}.experts.{e}.w2.weight"] = down[:, rows].contiguous()
            hidden = gate.shape[1]
            # Logits of spread about 4: a token's best experts clearly ahead, not one alone.
            tensors[f"{moe}.gate.weight"] = torch.randn(num_experts, hidden, generator=gen) * (
                4 / hidden**0.5
            )
        return tensors

    return _derived_model(source, f"moe-{num_experts}x{top_k}-{seed}", config, weights)


def _derived_model(source: Path, suffix: str, config: dict, weights=None) -> Path:
    """A model folder beside the tiny model, `<source name>-<suffix>`, with `config`: its other
    files links to `source`'s, except the weights when `weights()` gives them (then written to
    its own `model.safetensors`). Written once, in a temporary folder renamed into place; a
    folder whose links lead elsewhere (another checkout's files) is written again."""
    path = home() / "models" / f"{source.name}-{suffix}"
    files = [
        file
        for file in source.iterdir()
        if file.is_file()
        and file.suffix in (".json", ".safetensors")
        and file.name != "config.json"
        and not (weights is not None and file.suffix == ".safetensors")
    ]
    if (path / "config.json").is_file():
        if all((path / f.name).resolve() == f.resolve() for f in files):
            return path
        shutil.rmtree(path, ignore_errors=True)  # (its links point at another checkout's files)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    try:
        for file in files:
            (tmp / file.name).symlink_to(file.resolve())
        if weights is not None:
            from safetensors.torch import save_file

            save_file(weights(), str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        os.replace(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / "config.json").is_file():
            raise
    return path


def build_tiny_model(path: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama checkpoint (config, safetensors, byte-level BPE tokenizer).

    Built in a temporary folder and renamed into place, so a half-built model is never loaded.
    """
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from nanovllm.models.llama import CausalLM
    from nanovllm.models.model_args import ModelArgs
    from nanovllm.models.model_layers import ModelLayers

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    try:
        # Tokenizer: byte-level BPE, so any text round-trips and one character may span several
        # tokens (lesson 10 needs that).
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=384,
            special_tokens=["<|bos|>", "<|eos|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(_TOKENIZER_TEXT.splitlines(), trainer)
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": "<|bos|>",
                    "eos_token": "<|eos|>",
                    "model_max_length": 4096,  # the engine enforces max_model_len itself
                }
            )
        )
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": tok.get_vocab_size(),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "bos_token_id": tok.token_to_id("<|bos|>"),
            "eos_token_id": tok.token_to_id("<|eos|>"),
            "torch_dtype": "float32",
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        # Weights: the engine's own model class, randomly initialised. A larger spread than a
        # trained model's makes the logits peaked, so greedy outputs are stable.
        with torch.device("cpu"):
            model = CausalLM(ModelArgs.from_config(config), ModelLayers())
        gen = torch.Generator().manual_seed(seed)
        tensors = {}
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                value = torch.ones_like(param)
            else:
                value = torch.randn(param.shape, generator=gen) * 0.2
            tensors[name] = value.contiguous()
        save_file(tensors, str(tmp / "model.safetensors"))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def make_engine(**options):
    """An `LLMEngine` on the demo model, on the CPU, with the torch attention backend.

    Small defaults (a short context, a modest KV cache) keep start-up and steps quick; any
    `EngineConfig` field can be overridden.
    """
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine

    config = dict(
        model=str(demo_model_path()),
        block_size=16,
        num_kv_blocks=64,
        max_model_len=256,
        max_num_batched_tokens=256,
        device="cpu",
        attention_backend="torch",
        seed=0,
        # One thread: a tiny model's matrices are too small to split, and on a busy machine
        # extra threads only wait for each other.
        num_threads=1,
    )
    config.update(options)
    return LLMEngine(EngineConfig(**config))
