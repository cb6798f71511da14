"""Loading a checkpoint into a (possibly sharded) model, reading only this rank's slices.

A rank of a tensor-parallel model holds 1/N of most tensors. Reading each full tensor and then
keeping a slice would make every rank read, and hold for a moment, the whole checkpoint.
`safe_open(file).get_slice(name)[a:b]` (or `[:, a:b]` for columns) names just a slice of a
tensor in the memory-mapped file; copying it into the parameter reads only what the slice
covers. `LazyTensor` wraps such a slice behind the two things a layer's `weight_loader` uses,
`.shape` and `.narrow(dim, start, n)`, so the same weight loaders take a real tensor (in tests)
or a lazy one (here).

What is read: a rank's own (anonymous) memory grows by its parameters only, never by a whole
tensor. A row slice (column-parallel layers, embeddings) pages in only its rows of the file. A
column slice (row-parallel layers: o_proj, down_proj) copies only its columns, but its columns
are interleaved through every row of the row-major tensor, so the kernel pages in (shared page
cache, not this process's memory) nearly the whole tensor. `get_slice` makes the bounded read
explicit rather than relying on a full tensor's view of the memory-mapped file being lazy.
(`python -m nanovllm.bench.tools.tensor_parallel` measures both; the figures are in
nanovllm/bench/README.md.) Replicated tensors
(norms, a row-parallel bias, KV heads when there are fewer than ranks) are read whole by every
rank that holds them.

Hugging Face stores q_proj, k_proj and v_proj (gate_proj and up_proj) as separate tensors; the
fused layers hold them in one parameter. A mapping, vLLM's `stacked_params_mapping`, says where
each goes: `(param_name, checkpoint_name, shard_id)`, e.g. ("qkv_proj", "q_proj", "q"), so
`model.layers.0.self_attn.q_proj.weight` loads into `model.layers.0.self_attn.qkv_proj.weight`
through its `weight_loader(param, tensor, "q")`. Parameters without a `weight_loader` (norms,
plain layers) get their tensor copied whole. A mixture of experts stores each expert's matrices
as tensors of their own too; each loads into its slot of the layer's stacked expert weights
(`moe.expert_target`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from nanovllm.models.moe import expert_target

# (fused parameter name, Hugging Face checkpoint name, shard id): Llama, Qwen2 and Qwen3.
STACKED_PARAMS_MAPPING: list[tuple[str, str, str | int]] = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]


class WeightLoadError(ValueError):
    """A checkpoint that does not fit the model, naming the tensor and file at fault."""


class LazyTensor:
    """A tensor in an open safetensors file, read only as far as `narrow` asks.

    `bytes_read` counts the bytes of the slices handed out (each is then copied into a
    parameter, which is when the file is read). Valid only while its file is open.
    """

    def __init__(self, file_slice, name: str) -> None:
        self._slice = file_slice
        self.name = name
        self.shape = torch.Size(file_slice.get_shape())
        self.bytes_read = 0

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Read elements [start, start + length) along `dim` (all of every other dim)."""
        dim = dim % len(self.shape)
        if not (0 <= start and start + length <= self.shape[dim] and length >= 0):
            raise IndexError(
                f"{self.name}: narrow({dim}, {start}, {length}) outside shape {tuple(self.shape)}"
            )
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        tensor = self._slice[tuple(index)]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor


@dataclass
class LoadReport:
    """What `load_sharded` read: the bytes of the slices copied into parameters, against the
    bytes of every tensor in the files."""

    tensors: int = 0
    bytes_read: int = 0
    bytes_in_files: int = 0


def default_weight_loader(param: nn.Parameter, loaded_weight: LazyTensor | torch.Tensor) -> None:
    """A parameter held whole on every rank: copy the full tensor."""
    if tuple(loaded_weight.shape) != tuple(param.shape):
        raise ValueError(
            f"checkpoint tensor has shape {tuple(loaded_weight.shape)}, expected "
            f"{tuple(param.shape)}"
        )
    if param.dim() == 0:
        raise ValueError("scalar parameters are not supported")
    param.data.copy_(loaded_weight.narrow(0, 0, param.shape[0]))


def safetensors_nbytes(file: Path) -> int:
    """The total bytes of tensor data in a safetensors file, from its header."""
    with open(file, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    return sum(
        end - begin
        for name, info in header.items()
        if name != "__metadata__"
        for begin, end in [info["data_offsets"]]
    )


def _target(name: str, mapping: Sequence[tuple[str, str, str | int]], params: dict):
    """The parameter name and shard id a checkpoint tensor loads into.

    A mapping applies only when the model has the fused parameter, so an unfused model (plain
    q_proj, k_proj, v_proj) loads with the same mapping. An expert's tensor loads into its
    layer's stacked experts (`moe.expert_target`).
    """
    expert = expert_target(name)
    if expert is not None and expert[0] in params:
        return expert
    for param_name, ckpt_name, shard_id in mapping:
        part = f".{ckpt_name}."
        if part in name:
            fused_name = name.replace(part, f".{param_name}.")
            if fused_name in params:
                return fused_name, shard_id
    return name, None


def load_sharded(
    model: nn.Module,
    files: Iterable[str | Path],
    mapping: Sequence[tuple[str, str, str | int]] = STACKED_PARAMS_MAPPING,
    ignore: Sequence[str] = ("rotary_emb.",),
) -> LoadReport:
    """Load every tensor of the safetensors `files` into `model`'s parameters, this rank's slice.

    Checkpoint names that contain a mapping's `.checkpoint_name.` load into `.param_name.` with
    its shard id (when the model has that parameter); names containing a string in `ignore` are skipped (old checkpoints store RoPE
    tables, which nanovllm computes). Raises WeightLoadError for a tensor the model lacks, a
    shape that does not fit, or a parameter (or a fused parameter's shard) that no file held.
    Parameters shared between modules (tied embeddings) count as loaded through either name.
    """
    report = LoadReport()

    def tensors():
        for file in map(Path, files):
            report.bytes_in_files += safetensors_nbytes(file)
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for ckpt_name in f.keys():
                    if any(part in ckpt_name for part in ignore):
                        continue
                    tensor = LazyTensor(f.get_slice(ckpt_name), ckpt_name)
                    yield ckpt_name, tensor, f"in {str(file)!r}"
                    report.bytes_read += tensor.bytes_read

    report.tensors = load_tensors(model, tensors(), mapping)
    return report


def load_tensors(
    model: nn.Module,
    tensors: Iterable[tuple[str, LazyTensor | torch.Tensor, str]],
    mapping: Sequence[tuple[str, str, str | int]] = STACKED_PARAMS_MAPPING,
) -> int:
    """Load `(checkpoint name, tensor, where)` triples into `model`'s parameters, as
    `load_sharded` describes (`where` says where the tensor came from, in errors); the number of
    tensors loaded. A tensor is a `LazyTensor` or a plain torch tensor (the GGUF loader's,
    dequantized): a weight loader takes either, and `copy_` casts it to the parameter's dtype."""
    params = dict(model.named_parameters(remove_duplicate=False))
    fused = {p for p, _, _ in mapping}
    loaded: set[tuple[int, str | int | None]] = set()
    count = 0
    for ckpt_name, tensor, where in tensors:
        name, shard_id = _target(ckpt_name, mapping, params)
        if name not in params:
            raise WeightLoadError(
                f"unexpected tensor {ckpt_name!r} {where}: the model has no parameter {name!r}"
            )
        param = params[name]
        loader = getattr(param, "weight_loader", None)
        try:
            if loader is None:
                default_weight_loader(param, tensor)
            elif shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
        except (ValueError, IndexError) as exc:
            raise WeightLoadError(f"tensor {ckpt_name!r} {where}: {exc}") from exc
        loaded.add((id(param), shard_id))
        count += 1
    missing = []
    for name, param in params.items():
        parts = name.split(".")
        shards = [s for p, _, s in mapping if p in parts] if fused.intersection(parts) else [None]
        shards = getattr(param, "shard_ids", shards)  # (stacked experts: each expert's matrices)
        missing += [
            f"{name} (shard {s!r})" if s is not None else name
            for s in shards
            # a checkpoint that stores the fused tensor loads every shard at once (shard None)
            if (id(param), s) not in loaded and (id(param), None) not in loaded
        ]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise WeightLoadError(f"the checkpoint lacks {len(missing)} tensors: {shown}")
    return count
