"""P2pConnector: a prompt's KV computed on one engine, decoded on another (disaggregation).

One engine per phase: a *producer* (`kv_producer`) runs prompts, a *consumer* (`kv_consumer`)
decodes, and the prompt's KV crosses between them over a point-to-point link
(`p2p_transport.py`: torch.distributed on gloo). A proxy (`serve/disagg_proxy.py`) sends each
request to the producer with `max_tokens=1`, then to the consumer, naming both halves with one
`transfer_id` in vLLM's `kv_transfer_params`:

    producer  {"do_remote_decode": true,  "transfer_id": T}   its prompt's full blocks are sent
    consumer  {"do_remote_prefill": true, "transfer_id": T}   waits for T, loads, decodes

Producer, every step: the full prompt blocks a request marked `do_remote_decode` computed this
step are sent, each layer's K and V queued as soon as that layer has written them
(`KVConnectorExecutor` calls `save_kv_layer` from a hook after each decoder layer). When the
request finishes, a DONE message ends its transfer.

Consumer: its server holds a request marked `do_remote_prefill` until the transfer's DONE
arrives (`await_remote_kv`), or `timeout_s` passes or the link breaks; then the engine takes it.
Received blocks wait in host memory (`num_staging_blocks`, least recently used dropped first),
keyed by their prefix hash (`core/block_hash.py`), so at admission they are found exactly as a
prefix-cache hit is: the blocks after the local hit that the staging area holds are copied into
the request's new blocks before the forward pass, and `num_cached_tokens` counts them. The last
prompt token is always computed (it gives the first output token), and so is a partial last
block. A request whose KV did not arrive computes its prompt itself (`KVLoadFailed` says why).

vLLM's asynchronous connectors (NIXL) instead admit the request at once and park it
(WAITING_FOR_REMOTE_KVS) with its blocks allocated; here a waiting request holds no device
block, and the scheduler is unchanged. Blocks whose decode half never comes (the decode server
refused the request) stay staged until newer ones push them out.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nanovllm.core.block_hash import short
from nanovllm.events import KVBlockReceived, KVLoadFailed
from nanovllm.kv_transfer.base import (
    KVConnectorBase,
    KVConnectorMetadata,
    KVLoadError,
)
from nanovllm.kv_transfer.p2p_transport import CONSUMER, PRODUCER, P2pTransport
from nanovllm.kv_transfer.secret import check_transfer_params, kv_secret
from nanovllm.kv_transfer_config import KVTransferConfig
from nanovllm.request import Request

if TYPE_CHECKING:
    from nanovllm.core.scheduler import SchedulerOutput

logger = logging.getLogger("nanovllm")

# One link per engine process and role, shared by the connector's two sides.
_TRANSPORTS: dict[tuple[str, int, int], P2pTransport] = {}


def kv_transfer_params(request: Request) -> dict[str, Any]:
    """The request's `kv_transfer_params` (from the proxy), or {}."""
    extra = request.sampling_params.extra_args or {}
    params = extra.get("kv_transfer_params")
    return params if isinstance(params, dict) else {}


class P2pConnector(KVConnectorBase):
    name: ClassVar[str] = "P2pConnector"
    roles: ClassVar[tuple[str, ...]] = ("kv_producer", "kv_consumer")
    extra_config: ClassVar[dict[str, str]] = {
        "timeout_s": "seconds a consumer waits for a transfer before computing the prompt "
        "itself, a number > 0 (default 10)",
        "num_staging_blocks": "host-memory blocks a consumer keeps received KV in until it is "
        "loaded, an int >= 1 (default 1024)",
        "secret": "the KV secret both engines and the proxy hold (default $NANOVLLM_KV_SECRET, "
        "else $NANOVLLM_HOME/kv_secret, made on first use): `kv_transfer/secret.py`",
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        extra = self.config.kv_connector_extra_config
        self.timeout_s: float = float(extra.get("timeout_s", 10))
        self.num_staging_blocks: int = extra.get("num_staging_blocks", 1024)
        self.secret = kv_secret(extra.get("secret"))
        rank = PRODUCER if self.config.is_producer else CONSUMER
        key = (self.config.kv_ip, self.config.kv_port, rank)
        if key not in _TRANSPORTS or _TRANSPORTS[key].closed.is_set():
            _TRANSPORTS[key] = P2pTransport(*key, self.model_tag, self.secret)
        self.transport = _TRANSPORTS[key]
        # Consumer, scheduler side: events waiting for the step they belong to.
        self.pending_events: list = []
        self.reported_failures: set[str] = set()
        # Worker side: which layers of this step were saved (sent in order, each once).
        self.next_layer = 0

    @classmethod
    def check_config(cls, config: KVTransferConfig) -> None:
        super().check_config(config)
        if config.kv_port is None:
            raise ValueError(
                "P2pConnector needs kv_port: where the consumer listens and the producer connects"
            )
        if config.kv_ip in ("0.0.0.0", "::"):
            raise ValueError(
                f"kv_ip {config.kv_ip!r} is not an address: give the consumer's address, as the "
                "producer reaches it (both engines take the same kv_ip)"
            )
        extra = config.kv_connector_extra_config
        timeout = extra.get("timeout_s", 10)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout_s must be a number > 0, got {timeout!r}")
        n = extra.get("num_staging_blocks", 1024)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"num_staging_blocks must be an int >= 1, got {n!r}")
        secret = extra.get("secret")
        if secret is not None and not (isinstance(secret, str) and secret):
            raise ValueError("secret must be a non-empty string (the KV secret)")

    def check_kv_transfer_params(self, params: dict[str, Any]) -> str | None:
        """A server's request names a transfer: None if the proxy signed it with the KV secret,
        else why it is refused (`secret.py`)."""
        return check_transfer_params(self.secret, params)

    def close(self) -> None:
        self.transport.close()

    # --- consumer: waiting for a transfer (the server's side, before the engine) ---------------

    def wait_for_transfer(self, transfer_id: str, timeout_s: float) -> str | None:
        """Block until the transfer `transfer_id` has arrived (None) or failed or timed out
        (what happened): for a caller without an event loop (`nanovllm viz`'s disaggregated
        scenario)."""
        return self.transport.wait_for_transfer(transfer_id, timeout_s)

    async def await_remote_kv(self, params: dict[str, Any]) -> str | None:
        """Wait (without blocking the event loop) for the transfer `params` names; None when it
        arrived, else what went wrong (the request then computes its prompt)."""
        transfer_id = params.get("transfer_id")
        if not (self.config.is_consumer and params.get("do_remote_prefill") and transfer_id):
            return None
        error = await self.transport.await_transfer(str(transfer_id), self.timeout_s)
        if error is not None:
            logger.warning("nanovllm: KV transfer %s: %s; computing the prompt", transfer_id, error)
        return error

    # --- scheduler side -------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if self.config.is_consumer:
            self.take_received()
            transfer_id = kv_transfer_params(request).get("transfer_id")
            error = transfer_id and self.transport.transfer_error(str(transfer_id))
            if error and request.request_id not in self.reported_failures:
                self.reported_failures.add(request.request_id)
                self.pending_events.append((KVLoadFailed, request.request_id, error))
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def take_received(self) -> None:
        """Move the blocks received since the last step into the staging area."""
        staged = self.transport.staged
        for block in self.transport.take_inbox():
            staged[block.block_hash] = block
            staged.move_to_end(block.block_hash)
            self.pending_events.append(
                (KVBlockReceived, short(block.block_hash), block.transfer_id)
            )

    def num_held(self, block_hashes: list[bytes]) -> int:
        staged = self.transport.staged
        n = 0
        while n < len(block_hashes) and block_hashes[n] in staged:
            staged.move_to_end(block_hashes[n])  # used: the last to be dropped
            n += 1
        return n

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        step = scheduler_output.step
        if self.events.active:  # (received before loaded, the order they happened in)
            for cls, *fields in self.pending_events:
                self.events.emit(cls(step, *fields))
        self.pending_events.clear()
        meta = super().build_connector_meta(scheduler_output)
        # Bound the staging area, least recently used first, never a block this step loads.
        staged = self.transport.staged
        excess = len(staged) - self.num_staging_blocks
        if excess > 0:
            keep = {t.block_hash for t in meta.loads}
            oldest = itertools.islice(staged, excess + len(keep))  # (enough, even past `keep`)
            for block_hash in [h for h in oldest if h not in keep][:excess]:
                del staged[block_hash]
        return meta

    def plan_saves(self, meta: KVConnectorMetadata, scheduler_output: SchedulerOutput) -> None:
        """A producer's requests marked `do_remote_decode`: their prompt blocks this step fills."""
        if not self.config.is_producer:
            return

        for s in scheduler_output.scheduled:
            params = kv_transfer_params(s.request)
            if params.get("do_remote_decode"):  # (the worker names each block's transfer)
                meta.request_params[s.request.request_id] = params
        remote = meta.request_params
        meta.saves_after = self.new_full_blocks(
            scheduler_output,
            lambda request: request.num_prompt_tokens if request.request_id in remote else 0,
        )
        self.emit_saved(meta)

    def request_finished(
        self, request: Request, block_ids: tuple[int, ...]
    ) -> tuple[bool, dict | None]:
        params = kv_transfer_params(request)
        num_sent = self.req_num_saved_blocks.get(request.request_id, 0)  # (before super's pop)
        self.reported_failures.discard(request.request_id)
        super().request_finished(request, block_ids)
        if self.config.is_producer and params.get("do_remote_decode"):
            transfer_id = str(params.get("transfer_id", request.request_id))
            self.transport.send_done(transfer_id, num_sent)
            return False, {"do_remote_prefill": True, "transfer_id": transfer_id}
        return False, None

    # --- worker side ----------------------------------------------------------------------------

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(metadata)
        self.next_layer = 0

    def start_load_kv(self) -> None:
        """Copy the staged blocks this step loads into their device blocks, every layer."""
        meta = self.metadata
        if meta is None or not meta.loads:
            return
        errors: dict[str, str] = {}
        found = []
        for t in meta.loads:
            block = self.transport.staged.get(t.block_hash)
            if block is None:
                errors[t.request_id] = f"block {short(t.block_hash)} left the staging area"
            elif block.token_ids != t.token_ids:
                errors[t.request_id] = f"block {short(t.block_hash)} holds other tokens"
            elif block.kv[0][0].shape != self.kv_caches[0][0].shape[1:]:
                errors[t.request_id] = (
                    f"the producer's blocks are {tuple(block.kv[0][0].shape)}, "
                    f"this cache's {tuple(self.kv_caches[0][0].shape[1:])}"
                )
            else:
                found.append((t, block))
        if errors:
            raise KVLoadError(errors)
        block_ids = torch.tensor([t.block_id for t, _ in found], device=self.kv_caches[0][0].device)
        for layer, (k_cache, v_cache) in enumerate(self.kv_caches):
            # [num_loads, block_size, num_kv_heads, head_dim], into the requests' new blocks
            k_cache[block_ids] = torch.stack([b.kv[layer][0] for _, b in found]).to(k_cache)
            v_cache[block_ids] = torch.stack([b.kv[layer][1] for _, b in found]).to(v_cache)

    def save_kv_layer(self, layer: int, kv_cache: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Queue layer `layer`'s K and V of this step's sends (the first layer also queues the
        message's head). Layers go in order, each once: a later call for a layer already sent
        does nothing."""
        meta = self.metadata
        if meta is None or not meta.saves_after or layer != self.next_layer:
            return
        self.next_layer += 1
        k, v = kv_cache
        if layer == 0:
            self.transport.send_blocks(
                [self.transfer_id_of(t.request_id) for t in meta.saves_after],
                [t.block_hash for t in meta.saves_after],
                [t.token_ids for t in meta.saves_after],
                tuple(k.shape[1:]),
                k.dtype,
                len(self.kv_caches),
            )
        block_ids = torch.tensor([t.block_id for t in meta.saves_after], device=k.device)
        self.transport.send_layer(k[block_ids], v[block_ids])  # [n, block_size, heads, dim]

    def transfer_id_of(self, request_id: str | None) -> str:
        """The transfer a request's blocks belong to (its own id when the proxy named none)."""
        assert self.metadata is not None and request_id is not None
        return str(self.metadata.request_params[request_id].get("transfer_id", request_id))
