"""Loading a Hugging Face checkpoint folder: config, safetensors weights and tokenizer.

(A GGUF file, llama.cpp's one-file checkpoint, loads through the same three functions:
`gguf_loader.py` reads it.)

A checkpoint folder holds `config.json` (the architecture and its shape), the weights as
safetensors (one `model.safetensors`, or shards listed in `model.safetensors.index.json`) and
the tokenizer files. Everything is read from local files only: nanovllm never downloads.

Every way this can go wrong is a `ModelLoadError` that names the file, architecture or tensor
at fault, because "KeyError: 'model.layers.3.mlp.up_proj.weight'" teaches nobody anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from nanovllm.models import gguf_loader
from nanovllm.models.embedding import VocabParallelEmbedding
from nanovllm.models.gemma import GemmaForCausalLM
from nanovllm.models.linear import LinearBase
from nanovllm.models.llama import CausalLM
from nanovllm.models.model_args import ModelArgs
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.quantized_linear import QuantizedWeight
from nanovllm.models.sharded_loader import WeightLoadError, load_sharded, load_tensors

# The model class of each architecture that is not `CausalLM` (Llama, Mistral, Qwen2, Qwen3).
MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, hf_config: dict, device: torch.device) -> torch.dtype:
    """The dtype the model runs in. `"auto"` means the checkpoint's, where it runs well:

    - on a GPU, the checkpoint's `torch_dtype` when it is bfloat16 or float16; a float32
      checkpoint runs in bfloat16 (float16 where the GPU lacks bfloat16), as vLLM does;
    - on a CPU, float32 always: half-precision matmuls are far slower there than float32 ones
      (about 1 GFLOP/s for bfloat16 on the machine this was written on).
    """
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type != "cuda":
        return torch.float32
    stored = DTYPES.get(str(hf_config.get("torch_dtype") or hf_config.get("dtype") or ""))
    if stored in (torch.bfloat16, torch.float16):
        return stored
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


class ModelLoadError(ValueError):
    """A checkpoint folder that nanovllm cannot load, and why."""


def resolve_model_path(model: str | Path) -> Path:
    """The checkpoint a `model` argument names: a folder, a GGUF file, or a packaged GGUF file's
    name (`smollm2`, `gguf_loader.PACKAGED_GGUF`) when no such folder or file exists."""
    path = Path(model)
    if not path.exists():
        try:
            packaged = gguf_loader.resolve_packaged(str(model))
        except gguf_loader.GGUFError as exc:
            raise ModelLoadError(str(exc)) from None
        if packaged is not None:
            return packaged
    return path


def load_config(path: Path) -> dict:
    if gguf_loader.is_gguf(path):
        try:
            return gguf_loader.load_gguf_config(path)
        except gguf_loader.GGUFError as exc:
            raise ModelLoadError(str(exc)) from None
    if path.is_file() and path.suffix == ".gguf":
        raise ModelLoadError(f"{str(path)!r} is not a GGUF file (it does not start with b'GGUF')")
    if not path.is_dir():
        raise ModelLoadError(f"model path {str(path)!r} is not a folder")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"missing file {str(config_file)!r}")
    try:
        return json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{str(config_file)!r} is not valid JSON: {exc}") from exc


def load_model_args(path: Path) -> tuple[dict, ModelArgs]:
    """The checkpoint's config.json, and the model shape nanovllm reads from it."""
    config = load_config(path)
    try:
        return config, ModelArgs.from_config(config)
    except KeyError as exc:
        raise ModelLoadError(f"config.json in {str(path)!r} lacks the field {exc}") from exc
    except ValueError as exc:
        where = path if path.is_file() else path / "config.json"
        raise ModelLoadError(f"{exc} (in {str(where)!r})") from exc


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint, sharded or not."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [path / name for name in sorted(set(weight_map.values()))]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    else:
        raise ModelLoadError(f"missing weights: no model.safetensors or index in {str(path)!r}")
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f"missing weight shard {str(f)!r}")
    return files


def load_weights(model: CausalLM, path: Path) -> None:
    """Copy every tensor of the checkpoint into `model` (this rank's slice of it), checking
    names and shapes; q/k/v and gate/up go into their fused parameters (`sharded_loader.py`)."""
    if gguf_loader.is_gguf(path):
        try:
            config = gguf_loader.load_gguf_config(path)
            # blocks only for a model whose every weight matrix can take them
            matrices = [
                m for m in model.modules() if isinstance(m, LinearBase | VocabParallelEmbedding)
            ]
            keep = bool(matrices) and all(isinstance(m, QuantizedWeight) for m in matrices)
            load_tensors(model, gguf_loader.gguf_tensors(path, config, keep_quantized=keep))
        except (gguf_loader.GGUFError, WeightLoadError) as exc:
            raise ModelLoadError(f"checkpoint {str(path)!r}: {exc}") from exc
        return
    files = weight_files(path)
    for file in files:  # a truncated or corrupt file fails here, by name
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as exc:
            raise ModelLoadError(f"cannot read weights from {str(file)!r}: {exc}") from exc
    try:
        load_sharded(model, files)
    except WeightLoadError as exc:
        raise ModelLoadError(f"checkpoint {str(path)!r}: {exc}") from exc
    except Exception as exc:  # a truncated or corrupt file
        raise ModelLoadError(f"cannot read weights from {str(path)!r}: {exc}") from exc


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    layers: ModelLayers,
    max_position: int,
) -> CausalLM:
    """Build the model in `dtype` on `device` from `layers` (`model_layers.py`: its paged
    attention, its parallel linear layers) and load the checkpoint into it.

    The model is built directly in `dtype` on `device`: its layers allocate their weights
    uninitialised (`torch.empty`, `linear.py`), and the checkpoint fills them. So an 8B bfloat16
    model never exists in float32, and no time goes into initialising weights that are
    overwritten anyway.
    """
    path = Path(path)
    _, args = load_model_args(path)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model_class = MODEL_CLASSES.get(args.architecture, CausalLM)
            model = model_class(args, layers, max_position=max_position)
    finally:
        torch.set_default_dtype(default_dtype)
    load_weights(model, path)
    return model.eval()


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer, through transformers' AutoTokenizer, local files only (a
    GGUF file's from its metadata)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if gguf_loader.is_gguf(path):
        try:
            return gguf_loader.load_gguf_tokenizer(path)
        except Exception as exc:
            raise ModelLoadError(f"cannot load the tokenizer of {str(path)!r}: {exc}") from exc
    if not any(
        (path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")
    ):
        raise ModelLoadError(f"missing tokenizer: no tokenizer.json in {str(path)!r}")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer in {str(path)!r}: {exc}") from exc
