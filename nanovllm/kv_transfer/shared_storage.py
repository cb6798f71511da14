"""SharedStorageConnector: KV saved to files by one engine and loaded by another.

A producer (`kv_producer` or `kv_both`) writes the KV of every full block its requests compute
to `shared_storage_path`, one file per block, named by the block's hash (`core/block_hash.py`:
the hash chains every token before the block, so equal names mean equal prefixes). A consumer
(`kv_consumer` or `kv_both`), in another process or at another time, finds the blocks of a new
prompt there and loads them instead of computing them:

    shared_storage_path/<model tag>/<block hash>.pt
        {"token_ids": [block_size] int64,
         "k0": [block_size, num_kv_heads, head_dim], "v0": ..., "k1": ..., ...}  (every layer)

The model tag (checkpoint folder name and dtype) keeps one model's KV from being read by
another. A block is written to a temporary file and renamed, so a reader never sees half a
file; a block already on disk is not written again.

Loading checks what it reads: the file must be there, readable, hold every layer in the cache's
shape and dtype, and hold the very tokens of the block. Otherwise the load fails with the reason
(`KVLoadError`) and the request computes those tokens instead.

The lookup asks the file system once per block (`os.path.exists`), on the scheduler's thread.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from nanovllm.kv_transfer.base import (
    BlockTransfer,
    KVConnectorBase,
    KVConnectorMetadata,
    KVLoadError,
)
from nanovllm.kv_transfer_config import KVTransferConfig

if TYPE_CHECKING:
    from nanovllm.core.scheduler import SchedulerOutput


class SharedStorageConnector(KVConnectorBase):
    name: ClassVar[str] = "SharedStorageConnector"
    extra_config: ClassVar[dict[str, str]] = {
        "shared_storage_path": "an existing folder the KV files are written to and read from"
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        root = Path(self.config.kv_connector_extra_config["shared_storage_path"])
        self.folder = root / self.model_tag
        if self.config.is_producer:
            self.folder.mkdir(exist_ok=True)
        # Worker side: this step's saves, per layer, gathered by `save_kv_layer`.
        self.pending_saves: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.save_errors: list[str] = []  # failed writes (the KV is simply not there later)

    @classmethod
    def check_config(cls, config: KVTransferConfig) -> None:
        super().check_config(config)
        path = config.kv_connector_extra_config.get("shared_storage_path")
        if not isinstance(path, str | os.PathLike) or not str(path):
            raise ValueError(
                "SharedStorageConnector needs kv_connector_extra_config['shared_storage_path'], "
                f"a folder, got {path!r}"
            )
        if not Path(path).is_dir():
            raise ValueError(f"shared_storage_path {str(path)!r} is not an existing folder")

    def path_of(self, block_hash: bytes) -> Path:
        return self.folder / f"{block_hash.hex()}.pt"

    # --- scheduler side -------------------------------------------------------------------------

    def num_held(self, block_hashes: list[bytes]) -> int:
        n = 0
        while n < len(block_hashes) and self.path_of(block_hashes[n]).exists():
            n += 1
        return n

    def plan_saves(self, meta: KVConnectorMetadata, scheduler_output: SchedulerOutput) -> None:
        """A producer's new full blocks not on disk yet, saved once the forward pass has
        written them."""
        if not self.config.is_producer:
            return
        blocks = self.new_full_blocks(scheduler_output, lambda request: request.num_tokens)
        meta.saves_after = [t for t in blocks if not self.path_of(t.block_hash).exists()]
        self.emit_saved(meta)

    # --- worker side ----------------------------------------------------------------------------

    def start_load_kv(self) -> None:
        meta = self.metadata
        if meta is None or not meta.loads:
            return
        errors: dict[str, str] = {}
        for t in meta.loads:
            if t.request_id in errors:
                continue
            try:
                self.load_block(t)
            except Exception as exc:  # noqa: BLE001 - any bad file means: compute instead
                errors[t.request_id] = f"cannot load {self.path_of(t.block_hash)}: {exc}"
        if errors:
            raise KVLoadError(errors)

    def load_block(self, t: BlockTransfer) -> None:
        """Copy one block's KV from its file into device block `t.block_id`, after checking it."""
        data = torch.load(self.path_of(t.block_hash), map_location="cpu", weights_only=True)
        if not isinstance(data, dict):
            raise ValueError(f"not a KV block file (holds a {type(data).__name__})")
        tokens = data.get("token_ids")
        if tokens is None or tuple(tokens.tolist()) != t.token_ids:
            raise ValueError("it holds other tokens than the block's")
        blocks = []
        for layer, (k, v) in enumerate(self.kv_caches):
            for name, cache in ((f"k{layer}", k), (f"v{layer}", v)):
                saved = data.get(name)
                if saved is None or saved.shape != cache.shape[1:] or saved.dtype != cache.dtype:
                    got = None if saved is None else (tuple(saved.shape), saved.dtype)
                    want = (tuple(cache.shape[1:]), cache.dtype)
                    raise ValueError(f"{name} is {got}, the cache needs {want}")
                blocks.append((cache, saved))
        for cache, saved in blocks:  # (only once every layer checked out)
            cache[t.block_id] = saved.to(cache.device)

    def save_kv_layer(self, layer: int, kv_cache: tuple[torch.Tensor, torch.Tensor]) -> None:
        meta = self.metadata
        if meta is None or not meta.saves_after or layer in self.pending_saves:
            return  # (nothing to save, or saved already: each layer once per step)
        blocks = torch.tensor([t.block_id for t in meta.saves_after], device=kv_cache[0].device)
        k, v = kv_cache
        self.pending_saves[layer] = (k[blocks].to("cpu"), v[blocks].to("cpu"))

    def wait_for_save(self) -> None:
        meta = self.metadata
        if meta is None or not meta.saves_after:
            return
        for i, t in enumerate(meta.saves_after):
            data: dict[str, torch.Tensor] = {"token_ids": torch.tensor(t.token_ids)}
            for layer, (k, v) in sorted(self.pending_saves.items()):
                data[f"k{layer}"], data[f"v{layer}"] = k[i].clone(), v[i].clone()
            path = self.path_of(t.block_hash)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            try:
                torch.save(data, tmp)
                os.replace(tmp, path)  # atomic: a reader sees the whole file or none
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                self.save_errors.append(f"cannot save {path}: {exc}")
        self.pending_saves.clear()
