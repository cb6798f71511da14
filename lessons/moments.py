"""The moment a lesson's idea shows in a real run, found in the run's events.

`nanovllm lesson N --viz` opens the visualizer paused right there. Each moment is a question
asked of a recorded run, step by step (a step's events end with its `StepSummary`):

    new_block            a decoding request's last block is full and it takes a new one (02)
    hit_from_the_middle  a new request pulls a cached block out of the middle of the free
                         queue: neither the next to be handed out nor the last freed (03)
    seat_refilled        a request finished last step, and a waiting one takes its seat while
                         the others decode (06)
    preemption           the first preemption (07)
    first_hit            the first prefix-cache hit (08)
    chunk                the first prefill chunk: a prompt only partly computed this step
    chunk_with_decodes   a prefill chunk and decodes in one flat batch, on the executor panel (09)
    scattered_reads      attention reads a request's context from blocks that are not neighbours
                         in memory, on the executor panel (04)
    rejected_block_freed speculative decoding rejects proposals, and a block that held only
                         their slots goes back to the free queue (13)
    busiest_step         the step that computed the most tokens, with each tensor-parallel
                         rank's forward time (14)
    first_tier_hit       the first KV loaded back from the host tier instead of computed (15)

A moment with `panel="executor"` opens the visualizer on its executor panel (the step's flat
inputs, from the executor's own events). The free queue's order is not in the events directly; `hit_from_the_middle` follows it from
them (blocks leave when handed out or hit, and join the tail when freed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Moment:
    words: str  # "the first preemption"
    find: Callable[[list], int | None]  # the step it happens at, or None
    panel: str | None = None  # "executor": the visualizer opens on its executor panel
    # The request the moment was found on, given the events and its step (None: any); the
    # visualizer opens with it selected.
    subject: Callable[[list, int], str | None] | None = None

    def request(self, events: list, step: int) -> str | None:
        """The request to select at `step` (None when the moment names none)."""
        return self.subject(events, step) if self.subject is not None else None


def steps(events: list) -> Iterator[tuple[int, list]]:
    """(step number, the step's events), a step ending with its StepSummary."""
    frame: list = []
    for event in events:
        frame.append(event)
        if type(event).__name__ == "StepSummary":
            yield event.step, frame
            frame = []


def _first(events: list, test: Callable[[object], bool]) -> int | None:
    for step, frame in steps(events):
        if any(test(e) for e in frame):
            return step
    return None


def _kind(event: object) -> str:
    return type(event).__name__


def _new_block(events: list) -> int | None:
    for step, frame in steps(events):
        decoding = {
            e.request_id for e in frame if _kind(e) == "RequestScheduled" and not e.is_prefill
        }
        for e in frame:
            if _kind(e) == "BlockAllocated" and e.logical_index >= 1 and e.request_id in decoding:
                return step
    return None


def _hit_from_the_middle(events: list) -> int | None:
    queue: list[int] = []
    for step, frame in steps(events):
        for e in frame:
            kind = _kind(e)
            if kind == "EngineStarted":
                queue = list(range(e.num_kv_blocks))
            elif kind == "BlockAllocated" and e.block_id in queue:
                queue.remove(e.block_id)
            elif kind == "BlockFreed" and e.ref_count == 0:
                queue.append(e.block_id)
            elif kind == "CacheHit" and e.was_free and e.block_id in queue:
                position = queue.index(e.block_id)
                if 0 < position < len(queue) - 1:
                    return step
                queue.remove(e.block_id)
    return None


def _seat_refilled(events: list) -> int | None:
    finished_last_step = False
    for step, frame in steps(events):
        admitted = [
            e
            for e in frame
            if _kind(e) == "RequestScheduled" and e.num_computed_tokens == 0 and e.is_prefill
        ]
        decoding = any(_kind(e) == "RequestScheduled" and not e.is_prefill for e in frame)
        if finished_last_step and admitted and decoding:
            return step
        finished_last_step = any(_kind(e) == "RequestFinished" for e in frame)
    return None


def _rejected_block_freed(events: list) -> int | None:
    for step, frame in steps(events):
        rejected = {
            e.request_id
            for e in frame
            if _kind(e) == "SpecTokensVerified" and e.num_accepted < len(e.proposed)
        }
        # A request that finishes this step frees all its blocks: those are not a rollback.
        rejected -= {e.request_id for e in frame if _kind(e) == "RequestFinished"}
        if any(_kind(e) == "BlockFreed" and e.request_id in rejected for e in frame):
            return step
    return None


def _chunk_with_decodes(events: list) -> int | None:
    for step, frame in steps(events):
        scheduled = [e for e in frame if _kind(e) == "RequestScheduled"]
        if any(e.is_chunk for e in scheduled) and any(not e.is_prefill for e in scheduled):
            return step
    return None


def _scattered(events: list) -> Iterator[tuple[int, str]]:
    """(step, request) for each decode reading 3+ blocks that are not in id order one after
    the other (paging: the context is scattered over the cache), in order."""
    for step, frame in steps(events):
        for e in frame:
            if _kind(e) != "StepInputsPrepared":
                continue
            for i, table in enumerate(e.block_tables):
                decode = e.query_start_loc[i + 1] - e.query_start_loc[i] == 1
                jumps = any(b != a + 1 for a, b in zip(table, table[1:]))
                if decode and len(table) >= 3 and jumps:
                    yield step, e.request_ids[i]


def _scattered_reads(events: list) -> int | None:
    return next((step for step, _ in _scattered(events)), None)


def _scattered_request(events: list, step: int) -> str | None:
    return next((rid for at, rid in _scattered(events) if at == step), None)


def _first_request(kind: str) -> Callable[[list, int], str | None]:
    """The request of the first event of `kind` in `step`."""

    def subject(events: list, step: int) -> str | None:
        for at, frame in steps(events):
            if at == step:
                return next((e.request_id for e in frame if _kind(e) == kind), None)
        return None

    return subject


def _busiest_step(events: list) -> int | None:
    best, most = None, 0
    for e in events:
        if _kind(e) == "StepSummary":
            tokens = e.num_prefill_tokens + e.num_decode_tokens
            if tokens > most:
                best, most = e.step, tokens
    return best


MOMENTS: dict[str, Moment] = {
    "new_block": Moment("a decoding request takes a new block", _new_block),
    "hit_from_the_middle": Moment(
        "a prefix hit pulls a block out of the middle of the free queue", _hit_from_the_middle
    ),
    "seat_refilled": Moment("a waiting request takes a finished one's seat", _seat_refilled),
    "preemption": Moment(
        "the first preemption",
        lambda events: _first(events, lambda e: _kind(e) == "RequestPreempted"),
        subject=_first_request("RequestPreempted"),
    ),
    "first_hit": Moment(
        "the first prefix-cache hit",
        lambda events: _first(events, lambda e: _kind(e) == "CacheHit"),
        subject=_first_request("CacheHit"),
    ),
    "rejected_block_freed": Moment(
        "proposals rejected: a block that held only their slots goes back to the free queue",
        _rejected_block_freed,
    ),
    "busiest_step": Moment(
        "the step with the most tokens, and each rank's forward time for it", _busiest_step
    ),
    "first_tier_hit": Moment(
        "the first KV block loaded back from the host tier",
        lambda events: _first(events, lambda e: _kind(e) == "KVBlockLoaded"),
    ),
    "chunk": Moment(
        "the first prefill chunk",
        lambda events: _first(events, lambda e: _kind(e) == "RequestScheduled" and e.is_chunk),
    ),
    "chunk_with_decodes": Moment(
        "a prefill chunk and decodes share one flat batch (the executor panel)",
        _chunk_with_decodes,
        panel="executor",
    ),
    "scattered_reads": Moment(
        "attention reads a request's KV from scattered blocks through its block table "
        "(the executor panel)",
        _scattered_reads,
        panel="executor",
        subject=_scattered_request,
    ),
}
