"""OffloadingConnector: a host-memory tier under the device pool's prefix cache.

Without it, a cached block that the device pool hands out again is forgotten (`BlockEvicted`),
and the next request with that prefix computes it again. With it, the block's KV is first copied
into a host slot under the same block hash (`HostBlockTier`, an LRU of `num_cpu_blocks` slots),
and a later request whose prefix reaches past the device pool's hit finds the rest there:

    prompt blocks:   [ hit in the device pool | hit in the host tier | computed ]
                       (shared, no copy)        (copied in before       (this step)
                                                 the forward pass)

Each step, after scheduling (`build_connector_meta`):
- the blocks the device pool evicted this step (`SchedulerOutput.evicted_blocks`) are saved
  into the tier, unless it already holds their hash (then they are only touched); a full tier
  drops its least recently used entry, never one this step loads from;
- the tier hits of the requests admitted this step are loaded into their new blocks.

The worker does the saves first: an evicted block may be the very block a load (or the forward
pass) writes this step. Each is one indexed copy per K and V tensor of every layer
(`host[slots] = device[blocks]`, and back), between tensors of the same per-block shape.

It needs the prefix cache (its blocks are found by their hashes) and plays only `kv_both`: the
tier is this engine's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import torch

from nanovllm.core.block_hash import short
from nanovllm.events import KVBlockSaved, KVTierEvicted
from nanovllm.kv_transfer.base import (
    BlockTransfer,
    KVCaches,
    KVConnectorBase,
    KVConnectorMetadata,
)
from nanovllm.kv_transfer.host_tier import HostBlockTier
from nanovllm.kv_transfer_config import KVTransferConfig

if TYPE_CHECKING:
    from nanovllm.core.scheduler import SchedulerOutput


class OffloadingConnector(KVConnectorBase):
    name: ClassVar[str] = "OffloadingConnector"
    roles: ClassVar[tuple[str, ...]] = ("kv_both",)
    extra_config: ClassVar[dict[str, str]] = {
        "num_cpu_blocks": "host-memory blocks in the tier, an int >= 1"
    }
    keeps_a_host_tier: ClassVar[bool] = True  # `host_tier_cls` builds it (`create_connector`)

    def __init__(
        self, *args, host_tier_cls: Callable[[int], HostBlockTier] = HostBlockTier
    ) -> None:
        super().__init__(*args)
        self.num_cpu_blocks: int = self.config.kv_connector_extra_config["num_cpu_blocks"]
        # Scheduler side: the tier's bookkeeping (this step's loads pin their hashes: no save
        # this step may take their slots).
        self.tier = host_tier_cls(self.num_cpu_blocks)  # (lesson 15 gives the learner's)
        self.num_saves_dropped = 0  # evicted blocks not saved: every tier slot was pinned
        # Worker side: per layer, the tier's K and V, [num_cpu_blocks, block_size, heads, dim].
        self.host_caches: KVCaches = []

    @classmethod
    def check_config(cls, config: KVTransferConfig) -> None:
        super().check_config(config)
        n = config.kv_connector_extra_config.get("num_cpu_blocks")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(
                f"OffloadingConnector needs kv_connector_extra_config['num_cpu_blocks'], an "
                f"int >= 1, got {n!r}"
            )

    # --- scheduler side -------------------------------------------------------------------------

    def num_held(self, block_hashes: list[bytes]) -> int:
        return self.tier.num_matched(block_hashes)

    def load_slot(self, block_hash: bytes) -> int:
        """The slot holding `block_hash`, now the tier's most recently used entry."""
        slot = self.tier.lookup(block_hash)
        assert slot is not None, "a matched hash stays in the tier until the step's saves"
        self.tier.touch(block_hash)
        return slot

    def plan_saves(self, meta: KVConnectorMetadata, scheduler_output: SchedulerOutput) -> None:
        """The blocks the device pool evicted this step, into the tier (touched if it holds
        them already)."""
        step, pinned = meta.step, {t.block_hash for t in meta.loads}
        emit = self.events.active
        for block_id, block_hash in scheduler_output.evicted_blocks:
            if block_hash in self.tier:
                self.tier.touch(block_hash)  # the tier already holds this KV
                continue
            placed = self.tier.insert(block_hash, pinned)
            if placed is None:
                self.num_saves_dropped += 1
                continue
            slot, dropped = placed
            meta.saves_before.append(BlockTransfer(block_id, block_hash, (), None, slot))
            if emit:
                if dropped is not None:
                    self.events.emit(KVTierEvicted(step, short(dropped), slot))
                self.events.emit(KVBlockSaved(step, block_id, short(block_hash), slot))

    def reset_cache(self) -> None:
        self.tier.clear()

    def tier_entries(self) -> list[tuple[bytes, int]]:
        return list(self.tier.slot_of.items())

    # --- worker side ----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        super().register_kv_caches(kv_caches)
        # Beside a GPU the tier is page-locked (pinned) host memory, which CUDA copies to and
        # from directly.
        pin = kv_caches[0][0].device.type == "cuda"
        self.host_caches = [
            (
                torch.zeros((self.num_cpu_blocks, *k.shape[1:]), dtype=k.dtype, pin_memory=pin),
                torch.zeros((self.num_cpu_blocks, *v.shape[1:]), dtype=v.dtype, pin_memory=pin),
            )
            for k, v in kv_caches
        ]

    def start_load_kv(self) -> None:
        meta = self.metadata
        if meta is None:
            return
        device_tensors = [t for kv in self.kv_caches for t in kv]  # K, V of every layer
        host_tensors = [t for kv in self.host_caches for t in kv]
        if meta.saves_before:  # first: a block saved here may be one a load fills
            blocks, slots = self._indices(meta.saves_before, device_tensors[0].device)
            for device, host in zip(device_tensors, host_tensors):
                host[slots] = device[blocks].to("cpu")
        if meta.loads:
            blocks, slots = self._indices(meta.loads, device_tensors[0].device)
            for device, host in zip(device_tensors, host_tensors):
                device[blocks] = host[slots].to(device.device)

    @staticmethod
    def _indices(transfers: list[BlockTransfer], device) -> tuple[torch.Tensor, torch.Tensor]:
        """The transfers' device block ids (on `device`) and tier slots, as index tensors."""
        blocks = torch.tensor([t.block_id for t in transfers], device=device)
        return blocks, torch.tensor([t.tier_slot for t in transfers])
