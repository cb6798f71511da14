"""The engine's state as one event: where a subscriber that joins late starts from.

Events describe *changes*. A viewer that subscribes to an engine which has already served
requests (`nanovllm viz --connect` to a busy server) would otherwise start from a fresh engine's
picture: every block free and uncached, the free queue in id order. `engine_snapshot(engine)`
reads the scheduler and the KV cache manager once and returns an `EngineSnapshot` of plain
data; sent right after `EngineStarted` and before any later event, it makes the viewer's state
equal to the engine's, and the events that follow apply on top of it.

It must run where the engine runs (the server's engine thread), between two operations, so that
no event falls between the snapshot and the subscription.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanovllm.core.block_hash import short
from nanovllm.events import BlockSnapshot, EngineSnapshot, RequestSnapshot
from nanovllm.request import Request, RequestStatus

if TYPE_CHECKING:
    from nanovllm.engine.llm_engine import LLMEngine


def token_texts(tokenizer, token_ids: list[int]) -> tuple[str, ...]:
    """The text of each token on its own (a byte-level piece of a character decodes to U+FFFD)."""
    return tuple(tokenizer.decode([t]) for t in token_ids)


def engine_snapshot(engine: LLMEngine) -> EngineSnapshot:
    """The state of `engine` now: blocks, free queue order, cached hashes, requests, counters."""
    kv, scheduler = engine.kv_cache_manager, engine.scheduler
    blocks = tuple(
        BlockSnapshot(b.block_id, b.ref_cnt, short(b.block_hash) if b.block_hash else None)
        for b in kv.blocks
    )
    free_queue = tuple(b.block_id for b in kv.free_block_queue.get_all_free_blocks())
    # Aborted requests stay in `waiting` until they reach its head: skip them.
    waiting = tuple(r.request_id for r in scheduler.waiting if r.status != RequestStatus.FINISHED)
    running = tuple(r.request_id for r in scheduler.running)
    requests = tuple(_request(engine, scheduler.requests[rid]) for rid in (*waiting, *running))
    return EngineSnapshot(
        step=scheduler.step_count,
        blocks=blocks,
        free_queue=free_queue,
        waiting=waiting,
        running=running,
        requests=requests,
        num_preemptions=scheduler.num_preemptions,
        prefix_cache_queries=scheduler.prefix_cache_queries,
        prefix_cache_hits=scheduler.prefix_cache_hits,
    )


def _request(engine: LLMEngine, request: Request) -> RequestSnapshot:
    running = request.status == RequestStatus.RUNNING
    return RequestSnapshot(
        request_id=request.request_id,
        status="running" if running else "waiting",
        prompt=request.prompt,
        num_prompt_tokens=request.num_prompt_tokens,
        max_tokens=request.max_tokens,
        num_computed_tokens=request.num_computed_tokens,
        num_output_tokens=request.num_output_tokens,
        output_text=engine.output_processor.output_text(request.request_id),
        block_table=tuple(engine.kv_cache_manager.get_block_table(request.request_id)),
        num_cached_tokens=request.num_cached_tokens,
        num_preemptions=request.num_preemptions,
        tokens=token_texts(engine.tokenizer, request.all_token_ids),
    )
