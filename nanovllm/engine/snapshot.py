"""The engine's state as one event: where a subscriber that joins late starts from.

Events describe *changes*. A viewer that subscribes to an engine which has already served
requests (`nanovllm viz --connect` to a busy server) would otherwise start from a fresh engine's
picture: every block free and uncached, the free queue in id order. `engine_snapshot(...)`
reads the scheduler and the KV cache manager once and returns an `EngineSnapshot` of plain
data (`LLMEngine.subscribe(fn, snapshot=True)` sends it); sent right after `EngineStarted` and before any later event, it makes the viewer's state
equal to the engine's, and the events that follow apply on top of it.

It must run where the engine runs (the server's engine thread), between two operations, so that
no event falls between the snapshot and the subscription.

`core/step_summary.py` is the same idea once per step: the state after a step, as a
`StepSummary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanovllm.core.block_hash import short
from nanovllm.events import (
    BlockSnapshot,
    EngineSnapshot,
    RequestAdded,
    RequestSnapshot,
)
from nanovllm.request import Request, RequestStatus

if TYPE_CHECKING:
    from nanovllm.core.kv_cache_manager import KVCacheManager
    from nanovllm.core.kv_source import NullConnector
    from nanovllm.core.scheduler import Scheduler
    from nanovllm.engine.output_processor import OutputProcessor
    from nanovllm.engine.stats import EngineStats
    from nanovllm.kv_transfer.base import KVConnectorBase


def token_texts(tokenizer, token_ids: list[int]) -> tuple[str, ...]:
    """The text of each token on its own (a byte-level piece of a character decodes to U+FFFD)."""
    return tuple(tokenizer.decode([t]) for t in token_ids)


def request_added(tokenizer, request: Request) -> RequestAdded:
    """The event of a request the engine accepted (with each prompt token's text)."""
    return RequestAdded(
        request.request_id,
        request.prompt,
        request.num_prompt_tokens,
        request.max_tokens,
        token_texts(tokenizer, request.prompt_token_ids),
    )


def engine_snapshot(
    scheduler: Scheduler,
    kv: KVCacheManager,
    stats: EngineStats,
    output_processor: OutputProcessor,
    tokenizer,
    kv_source: KVConnectorBase | NullConnector,
) -> EngineSnapshot:
    """The engine's state now: blocks, free queue order, cached hashes, requests, counters."""
    blocks = tuple(
        BlockSnapshot(b.block_id, b.ref_cnt, short(b.block_hash) if b.block_hash else None)
        for b in kv.blocks
    )
    free_queue = tuple(b.block_id for b in kv.free_block_queue.get_all_free_blocks())
    # Aborted requests stay in `waiting` until they reach its head: skip them.
    waiting = tuple(r.request_id for r in scheduler.waiting if r.status != RequestStatus.FINISHED)
    running = tuple(r.request_id for r in scheduler.running)
    requests = tuple(
        _request(scheduler.requests[rid], kv, output_processor, tokenizer)
        for rid in (*waiting, *running)
    )
    return EngineSnapshot(
        step=scheduler.step_count,
        blocks=blocks,
        free_queue=free_queue,
        waiting=waiting,
        running=running,
        requests=requests,
        num_preemptions=stats.num_preemptions,
        prefix_cache_queries=stats.prefix_cache_queries,
        prefix_cache_hits=stats.prefix_cache_hits,
        external_prefix_cache_hits=stats.external_prefix_cache_hits,
        # The host tier's entries, (short hash, slot), least recently used first (none without
        # an OffloadingConnector).
        tier=tuple((short(h), slot) for h, slot in kv_source.tier_entries()),
    )


def _request(
    request: Request, kv: KVCacheManager, output_processor: OutputProcessor, tokenizer
) -> RequestSnapshot:
    running = request.status == RequestStatus.RUNNING
    return RequestSnapshot(
        request_id=request.request_id,
        status="running" if running else "waiting",
        prompt=request.prompt,
        num_prompt_tokens=request.num_prompt_tokens,
        max_tokens=request.max_tokens,
        num_computed_tokens=request.num_computed_tokens,
        num_output_tokens=request.num_output_tokens,
        output_text=output_processor.output_text(request.request_id),
        block_table=tuple(kv.get_block_table(request.request_id)),
        num_cached_tokens=request.num_cached_tokens,
        num_preemptions=request.num_preemptions,
        tokens=token_texts(tokenizer, request.all_token_ids),
        group_block_tables=kv.block_tables(request.request_id)[1:],
    )
