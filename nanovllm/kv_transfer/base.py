"""KVConnectorBase: vLLM's interface for KV that lives outside the engine's device pool.

The paged KV cache (`core/kv_cache_manager.py`) answers "which tokens already have KV?" from one
pool of device blocks. A KV connector adds places further away: a host-memory tier that catches
blocks the pool evicts (`offloading.py`), or files another engine wrote (`shared_storage.py`).
For the scheduler a connector's hit is one more source of computed tokens; for the model it is
KV copied into the request's blocks before the forward pass reads them.

As in vLLM v1 (`KVConnectorBase_V1`), one class plays two roles, as two objects that share
nothing but the per-step `KVConnectorMetadata`:

Scheduler side (with the scheduler, on the CPU, every step):
    get_num_new_matched_tokens(request, num_computed_tokens)
        how many prompt tokens past the local prefix-cache hit the connector can supply
    update_state_after_alloc(request, block_ids, num_external_tokens)
        the request was admitted: its blocks for those tokens are known, plan their load
    build_connector_meta(scheduler_output)
        this step's transfers: what the worker must load and save, and when
    request_finished(request, block_ids)
        whether the request's blocks must outlive it until their KV is saved

Worker side (with the KV cache, around the forward pass):
    register_kv_caches(kv_caches)   the per-layer K/V tensors the transfers read and write
    bind_connector_metadata(meta)   this step's transfers
    start_load_kv()                 before the forward pass: copy KV in (and, for the tier, the
                                    evicted blocks out before they are overwritten)
    wait_for_layer_load(layer)      before a layer's attention reads its cache
    save_kv_layer(layer, kv_cache)  after a layer has written this step's KV
    wait_for_save()                 before the step returns: every save is done

In vLLM the layerwise calls run inside each attention layer, so a transfer can overlap the
forward pass. Here `start_load_kv` finishes the loads before the forward pass, and
`KVConnectorExecutor` (`executor.py`) calls `save_kv_layer` from a hook after each decoder
layer, which keeps the model's code free of connector calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nanovllm.core.block_hash import extend_block_hashes, short
from nanovllm.events import EventBus, KVBlockLoaded, KVBlockSaved, KVLoadFailed
from nanovllm.kv_transfer_config import KVTransferConfig
from nanovllm.request import Request

if TYPE_CHECKING:
    from nanovllm.core.scheduler import SchedulerOutput

logger = logging.getLogger("nanovllm")

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K and V, [num_blocks, ...]


class KVConnectorRole(Enum):
    SCHEDULER = "scheduler"
    WORKER = "worker"


@dataclass(frozen=True)
class BlockTransfer:
    """One block's KV moving between device block `block_id` and the outside, where it is
    known by `block_hash` (a host tier slot `tier_slot`, or a file named by the hash)."""

    block_id: int
    block_hash: bytes
    token_ids: tuple[int, ...]  # the block's tokens (stored with its KV, checked on load)
    request_id: str | None = None
    tier_slot: int = -1


@dataclass
class KVConnectorMetadata:
    """What the worker side does this step, in this order: `saves_before` (device -> outside,
    before the forward pass overwrites those blocks), `loads` (outside -> device, before the
    forward pass reads them), `saves_after` (device -> outside, once the forward pass has
    written them)."""

    step: int
    saves_before: list[BlockTransfer] = field(default_factory=list)
    loads: list[BlockTransfer] = field(default_factory=list)
    saves_after: list[BlockTransfer] = field(default_factory=list)
    # What else the worker needs per request (P2pConnector: each sender's transfer id).
    request_params: dict[str, dict[str, Any]] = field(default_factory=dict)


class KVLoadError(RuntimeError):
    """Loading external KV failed for these requests (request id -> what happened). Raised by
    the worker side before the forward pass; the engine undoes the step, and the requests
    compute those tokens instead."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"request {rid!r}: {e}" for rid, e in errors.items()))
        self.errors = errors


class KVConnectorBase:
    """See the module docstring. Subclasses set `name`, the `roles` they can play and the
    `extra_config` keys they take, and implement both sides."""

    name: ClassVar[str] = "base"
    roles: ClassVar[tuple[str, ...]] = ("kv_producer", "kv_consumer", "kv_both")
    extra_config: ClassVar[dict[str, str]] = {}  # key -> what it means (for error messages)

    def __init__(
        self,
        config: KVTransferConfig,
        role: KVConnectorRole,
        block_size: int,
        model_tag: str,
        events: EventBus | None = None,
    ) -> None:
        self.config = config
        self.role = role
        self.block_size = block_size
        self.model_tag = model_tag  # the model and dtype whose KV this is (names stored KV)
        self.events = events or EventBus()
        # Scheduler side: each live request's block hashes (computed once, as the KV cache
        # manager does), and the requests whose external KV failed to load: they compute.
        self.req_block_hashes: dict[str, list[bytes]] = {}
        self.failed_requests: set[str] = set()
        # Each request's last match, (first block, number of blocks), until it is admitted, and
        # the loads planned for the step being scheduled.
        self.req_match: dict[str, tuple[int, int]] = {}
        self.step_loads: list[BlockTransfer] = []
        # A producer's: per request, how many of its blocks were considered for saving.
        self.req_num_saved_blocks: dict[str, int] = {}
        # Worker side: the KV cache, and this step's transfers.
        self.kv_caches: KVCaches = []
        self.metadata: KVConnectorMetadata | None = None

    @classmethod
    def check_config(cls, config: KVTransferConfig) -> None:
        """Raise a ValueError naming what in `config` this connector cannot take."""
        if config.kv_role not in cls.roles:
            raise ValueError(
                f"{cls.name} cannot play kv_role={config.kv_role!r}; it plays {list(cls.roles)}"
            )
        unknown = sorted(set(config.kv_connector_extra_config) - set(cls.extra_config))
        if unknown:
            takes = ", ".join(f"{k} ({v})" for k, v in cls.extra_config.items()) or "nothing"
            raise ValueError(
                f"{cls.name}'s kv_connector_extra_config has unknown keys {unknown}; "
                f"it takes {takes}"
            )

    # --- scheduler side -------------------------------------------------------------------------

    def block_hashes(self, request: Request) -> list[bytes]:
        """The hashes of the request's full blocks (`core/block_hash.py`), kept per request."""
        hashes = self.req_block_hashes.setdefault(request.request_id, [])
        extend_block_hashes(hashes, request.all_token_ids, self.block_size, request.num_tokens)
        return hashes

    def block_tokens(self, request: Request, i: int) -> tuple[int, ...]:
        """The token ids of the request's logical block `i`."""
        return tuple(request.all_token_ids[i * self.block_size : (i + 1) * self.block_size])

    def may_load(self, request: Request) -> bool:
        """Whether this request may take external KV at all: a consumer's, not after a failed
        load, and not when it asks for prompt logprobs (each prompt token's logits must be
        computed, as with the local prefix cache)."""
        return (
            self.config.is_consumer
            and request.request_id not in self.failed_requests
            and request.sampling_params.prompt_logprobs is None
        )

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """How many tokens after the first `num_computed_tokens` (the local prefix-cache hit,
        whole blocks) the connector can load, and whether the load is asynchronous (never here).
        At least one prompt token is always left to compute."""
        if not self.may_load(request):
            return 0, False
        hashes = self.block_hashes(request)
        first = num_computed_tokens // self.block_size
        last = (request.num_tokens - 1) // self.block_size  # leave a token to compute
        n = self.num_held(hashes[first:last])
        self.req_match[request.request_id] = (first, n)
        return n * self.block_size, False

    def num_held(self, block_hashes: list[bytes]) -> int:
        """How many of `block_hashes`, from the first, the connector holds (a prefix hit)."""
        raise NotImplementedError

    def update_state_after_alloc(
        self, request: Request, block_ids: tuple[int, ...], num_external_tokens: int
    ) -> None:
        """The request was admitted with `num_external_tokens` from this connector; `block_ids`
        is its whole block table, the external tokens' blocks among it: plan their loads."""
        first, n = self.req_match.pop(request.request_id, (0, 0))
        assert num_external_tokens == n * self.block_size
        hashes = self.block_hashes(request)
        for i in range(first, first + n):
            tokens = self.block_tokens(request, i)
            slot = self.load_slot(hashes[i])
            self.step_loads.append(
                BlockTransfer(block_ids[i], hashes[i], tokens, request.request_id, slot)
            )

    def load_slot(self, block_hash: bytes) -> int:
        """Where a planned load reads `block_hash` from: a tier slot, or -1 (no slots)."""
        return -1

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """This step's transfers, once the step is scheduled: the loads planned at admission,
        the saves (`plan_saves`), then a `KVBlockLoaded` event per load (after the saves'
        events: the tier's saves come first in its LRU order, as the visualizer replays it)."""
        step = scheduler_output.step
        meta = KVConnectorMetadata(step, loads=self.step_loads)
        self.step_loads = []
        self.plan_saves(meta, scheduler_output)
        if self.events.active:
            for t in meta.loads:
                self.events.emit(
                    KVBlockLoaded(step, t.request_id, t.block_id, short(t.block_hash), t.tier_slot)
                )
        return meta

    def plan_saves(self, meta: KVConnectorMetadata, scheduler_output: SchedulerOutput) -> None:
        """Add this step's saves to `meta` (and their events); none here."""

    def new_full_blocks(
        self, scheduler_output: SchedulerOutput, end_of: Callable[[Request], int]
    ) -> list[BlockTransfer]:
        """The blocks this step fills within each request's first `end_of(request)` tokens
        (never past `num_tokens`: proposed tokens may be rejected), each considered once per
        request and once per step."""
        saves: list[BlockTransfer] = []
        seen: set[bytes] = set()
        for s in scheduler_output.scheduled:
            request, rid = s.request, s.request.request_id
            end = min(s.num_computed_tokens + s.num_new_tokens, end_of(request), request.num_tokens)
            num_full = end // self.block_size
            start = self.req_num_saved_blocks.get(rid, 0)
            if num_full <= start:
                continue
            hashes = self.block_hashes(request)
            for i in range(start, num_full):
                if hashes[i] not in seen:
                    seen.add(hashes[i])
                    tokens = self.block_tokens(request, i)
                    saves.append(BlockTransfer(s.block_table[i], hashes[i], tokens, rid))
            self.req_num_saved_blocks[rid] = num_full
        return saves

    def emit_saved(self, meta: KVConnectorMetadata) -> None:
        """A `KVBlockSaved` per block of `meta.saves_after` (saved for its request)."""
        if self.events.active:
            for t in meta.saves_after:
                self.events.emit(
                    KVBlockSaved(meta.step, t.block_id, short(t.block_hash), -1, t.request_id)
                )

    def request_finished(
        self, request: Request, block_ids: tuple[int, ...]
    ) -> tuple[bool, dict | None]:
        """The request is done. Returns whether its blocks must stay allocated until the
        connector has saved them (vLLM's delay-free; False here: every save finishes within its
        step) and parameters for a remote consumer (none here)."""
        self.req_block_hashes.pop(request.request_id, None)
        self.req_match.pop(request.request_id, None)
        self.req_num_saved_blocks.pop(request.request_id, None)
        self.failed_requests.discard(request.request_id)
        return False, None

    def load_failed(self, step: int, errors: dict[str, str]) -> None:
        """These requests' external KV could not be loaded (request id -> what happened): the
        engine undid the step (they wait again, nothing they had is lost), and from now on
        they compute those tokens."""
        for request_id, error in errors.items():
            logger.warning(
                "nanovllm: request %r: %s; computing those tokens instead", request_id, error
            )
            self.failed_requests.add(request_id)
            if self.events.active:
                self.events.emit(KVLoadFailed(step, request_id, error))

    def check_kv_transfer_params(self, params: dict[str, Any]) -> str | None:
        """Whether a server may act on a request's `kv_transfer_params`: None (yes), or why
        not (the server refuses the request). A connector that never reads them: yes."""
        return None

    async def await_remote_kv(self, params: dict[str, Any]) -> str | None:
        """A server's request carries `kv_transfer_params` (from a disaggregated proxy): wait
        until the KV they name has arrived. Returns what went wrong, or None (nothing to wait
        for here)."""
        return None

    def close(self) -> None:
        """The engine shuts down: release what the connector holds (a network link)."""

    def reset_cache(self) -> None:
        """Forget stored KV that the engine's prefix-cache reset makes stale (nothing here)."""

    def tier_entries(self) -> list[tuple[bytes, int]]:
        """A host tier's entries, (block hash, slot), least recently used first (none here): for
        the engine's snapshot (`engine/snapshot.py`)."""
        return []

    # --- worker side ----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        self.kv_caches = kv_caches

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self.metadata = metadata

    def clear_connector_metadata(self) -> None:
        self.metadata = None

    def start_load_kv(self) -> None:
        """Before the forward pass: this step's `saves_before`, then its `loads`. Raises
        `KVLoadError` naming the requests whose KV could not be loaded."""

    def wait_for_layer_load(self, layer: int) -> None:
        """Before layer `layer` reads its cache: its loads are done (`start_load_kv` is
        synchronous, so they are)."""

    def save_kv_layer(self, layer: int, kv_cache: tuple[torch.Tensor, torch.Tensor]) -> None:
        """After layer `layer` wrote this step's KV: start saving its part of `saves_after`.
        Called from a hook as the layer finishes, and again for every layer after the forward
        pass (for layers whose hook did not run): save each layer once per step."""

    def wait_for_save(self) -> None:
        """Before the step returns: every save of this step is done."""
