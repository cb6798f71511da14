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
pass) writes this step. Both are one gather per layer (`tensor[indices]`), from the device's
tensors into host tensors of the same per-block shape, and back.

It needs the prefix cache (its blocks are found by their hashes) and plays only `kv_both`: the
tier is this engine's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from nanovllm.core.block_hash import short
from nanovllm.events import KVBlockLoaded, KVBlockSaved, KVTierEvicted
from nanovllm.kv_transfer.base import (
    BlockTransfer,
    KVCaches,
    KVConnectorBase,
    KVConnectorMetadata,
)
from nanovllm.kv_transfer.host_tier import HostBlockTier
from nanovllm.kv_transfer_config import KVTransferConfig
from nanovllm.request import Request

if TYPE_CHECKING:
    from nanovllm.core.scheduler import SchedulerOutput


class OffloadingConnector(KVConnectorBase):
    name: ClassVar[str] = "OffloadingConnector"
    roles: ClassVar[tuple[str, ...]] = ("kv_both",)
    extra_config: ClassVar[dict[str, str]] = {
        "num_cpu_blocks": "host-memory blocks in the tier, an int >= 1"
    }
    # The tier's class: the lesson's `--run` swaps in the learner's (`lessons/15_*`).
    tier_class: ClassVar[type] = HostBlockTier

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.num_cpu_blocks: int = self.config.kv_connector_extra_config["num_cpu_blocks"]
        # Scheduler side: the tier's bookkeeping, and this step's planned loads (their hashes
        # are pinned: no save this step may take their slots).
        self.tier = self.tier_class(self.num_cpu_blocks)
        self.req_match: dict[str, tuple[int, int]] = {}  # request -> (first block, num blocks)
        self.step_loads: list[BlockTransfer] = []
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

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if not self.may_load(request):
            return 0, False
        hashes = self.block_hashes(request)
        first = num_computed_tokens // self.block_size
        last = (request.num_tokens - 1) // self.block_size  # leave a token to compute
        n = self.tier.num_matched(hashes[first:last])
        self.req_match[request.request_id] = (first, n)
        return n * self.block_size, False

    def update_state_after_alloc(
        self, request: Request, block_ids: tuple[int, ...], num_external_tokens: int
    ) -> None:
        first, n = self.req_match.pop(request.request_id, (0, 0))
        assert num_external_tokens == n * self.block_size
        hashes = self.block_hashes(request)
        for i in range(first, first + n):
            slot = self.tier.lookup(hashes[i])
            assert slot is not None, "a matched hash stays in the tier until the step's saves"
            self.tier.touch(hashes[i])
            self.step_loads.append(
                BlockTransfer(
                    block_ids[i], hashes[i], self.block_tokens(request, i), request.request_id, slot
                )
            )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        step = scheduler_output.step
        meta = KVConnectorMetadata(step, loads=self.step_loads)
        self.step_loads = []
        pinned = {t.block_hash for t in meta.loads}
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
        if emit:
            for t in meta.loads:
                self.events.emit(
                    KVBlockLoaded(step, t.request_id, t.block_id, short(t.block_hash), t.tier_slot)
                )
        return meta

    def request_finished(
        self, request: Request, block_ids: tuple[int, ...]
    ) -> tuple[bool, dict | None]:
        self.req_match.pop(request.request_id, None)
        return super().request_finished(request, block_ids)

    def reset_cache(self) -> None:
        self.tier.clear()

    # --- worker side ----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        super().register_kv_caches(kv_caches)
        # Page-locked host memory makes device <-> host copies faster on a GPU.
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
        for transfers, to_host in ((meta.saves_before, True), (meta.loads, False)):
            if not transfers:
                continue
            blocks = torch.tensor([t.block_id for t in transfers])
            slots = torch.tensor([t.tier_slot for t in transfers])
            for (k, v), (host_k, host_v) in zip(self.kv_caches, self.host_caches):
                if to_host:
                    host_k[slots] = k[blocks.to(k.device)].to("cpu")
                    host_v[slots] = v[blocks.to(v.device)].to("cpu")
                else:
                    k[blocks.to(k.device)] = host_k[slots].to(k.device)
                    v[blocks.to(v.device)] = host_v[slots].to(v.device)
