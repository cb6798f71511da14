"""The steps panel's state: the step in progress, the last step, the timeline and the totals.

`StepsState` is one panel of `VizState` (`state.py`); `reduce_steps` is its pure reducer.
Every event joins the step in progress (`draft`), so this panel changes on every event; the
`StepSummary` closes the draft into `last_step` and one more column of the batch timeline.
A step's story in words (`StepRecord.notes`) is not made here: the record holds a `Story`
(`story.StepStory`), which tells it from the step's events when a view asks.

Besides its own panel the reducer reads the queues and the blocks panels as they were before
the event (a request's status at its scheduling, a block's place in the free queue) and the
block size, each passed to it by `state.reduce`.

Speculative decoding: a decoding request with proposals is scheduled for 1 + k tokens
(`Scheduled.num_proposed`); the step keeps each verification's counts. With a KV connector
(`tier.py`) each step keeps its saves and loads; tokens loaded from the connector are taken out
of the prefix-cache hits (the scheduler counts them apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, Protocol

from nanovllm.events import (
    BlockAllocated,
    BlockEvicted,
    BlockFreed,
    CacheHit,
    EngineSnapshot,
    Event,
    KVBlockLoaded,
    KVBlockSaved,
    KVLoadFailed,
    KVTierEvicted,
    RequestFinished,
    RequestPreempted,
    RequestRejected,
    RequestScheduled,
    SpecTokensVerified,
    StepSummary,
    TokenEmitted,
)
from nanovllm.viz.frozen import evolve
from nanovllm.viz.queues import WAITING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nanovllm.viz.blocks import BlocksState
    from nanovllm.viz.note import Note
    from nanovllm.viz.queues import QueuesState

# What a request did in one step: one cell of the batch timeline.
PREFILL = "prefill"  # the (last piece of the) prompt was computed and a token sampled
CHUNK = "chunk"  # a piece of a prompt too long for the step's token budget
DECODE = "decode"  # one token in, one token out
SPEC = "spec"  # a decode with proposed tokens to verify: 1 + k tokens in, 1 to k + 1 out
PREEMPTED = "preempted"  # lost its blocks this step, back to the waiting queue
WAIT = "waiting"  # in the waiting queue, not scheduled

# Bounds, so a demo that runs for hours keeps a constant cost per event.
MAX_TIMELINE = 400  # steps of history kept for the timeline
MAX_RECENT = 20  # steps in the moving averages (tokens/s, step time)


class Story(Protocol):
    """What tells a step in words (`story.StepStory`): the notes for its first events."""

    def notes(self, events: tuple[Event, ...]) -> tuple[Note, ...]: ...


@dataclass(frozen=True)
class Scheduled:
    """One request's part of a step."""

    request_id: str
    num_tokens: int
    kind: str  # PREFILL, CHUNK or DECODE
    num_computed_tokens: int  # already in the cache before the step (prefix hits included)

    @property
    def is_decode(self) -> bool:
        return self.kind == DECODE

    @property
    def num_proposed(self) -> int:
        """Proposed tokens computed to be verified: a decode's tokens beyond its own one."""
        return self.num_tokens - 1 if self.kind == DECODE else 0


@dataclass(frozen=True)
class StepRecord:
    """What one step did. While the step is in progress it is the state's `draft`."""

    step: int = 0
    scheduled: tuple[Scheduled, ...] = ()
    admitted: tuple[str, ...] = ()  # moved from waiting to running
    preempted: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    taken: tuple[int, ...] = ()  # blocks that left the free queue at its head
    pulled: tuple[int, ...] = ()  # blocks a prefix-cache hit pulled out of its middle
    returned: tuple[int, ...] = ()  # blocks that joined its tail
    evicted: tuple[int, ...] = ()  # blocks whose cached prefix was forgotten
    # Where a prefix hit pulled a block out of the free queue: (the block before it in the
    # queue, None at the head; the block pulled). Views draw a gap there.
    gaps: tuple[tuple[int | None, int], ...] = ()
    # Speculative decoding: (request id, tokens proposed, tokens accepted) per verification.
    verified: tuple[tuple[str, int, int], ...] = ()
    # KV connector traffic (`tier.py`): saves (device block, tier slot), loads (tier slot,
    # device block), slots the full tier emptied, requests whose load failed. Slot -1: the
    # connector has no tier (shared storage).
    saved: tuple[tuple[int, int], ...] = ()
    loaded: tuple[tuple[int, int], ...] = ()
    dropped: tuple[int, ...] = ()
    load_failed: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()  # the step's events in engine order
    summary: StepSummary | None = None
    # Tells the step in words from its events (`story.py`); every version of one step's
    # record shares it. Not compared: the notes follow from the events.
    story: Story | None = field(default=None, compare=False, repr=False)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def notes(self) -> tuple[Note, ...]:
        """The step told in words (see `narrative.py`), up to its latest event."""
        return self.story.notes(self.events) if self.story is not None else ()


@dataclass(frozen=True)
class TimelineColumn:
    step: int
    cells: Mapping[str, str]  # request id -> PREFILL, CHUNK, DECODE, SPEC, PREEMPTED or WAIT


@dataclass(frozen=True)
class Metrics:
    """Running totals; the derived figures are properties."""

    num_steps: int = 0
    num_tokens: int = 0  # computed, prefill + decode
    num_output_tokens: int = 0
    num_preemptions: int = 0
    num_finished: int = 0
    num_rejected: int = 0
    engine_time: float = 0.0  # schedule + forward, summed over steps
    prefix_queries: int = 0  # tokens of requests at admission (the scheduler's definition)
    prefix_hits: int = 0  # of those, tokens served by the prefix cache (not a KV connector)
    # Speculative decoding, as the engine's `stats.spec_decoding` counts it: verifications (`drafts`),
    # tokens proposed, tokens accepted.
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # The last MAX_RECENT steps: (tokens, schedule seconds, forward seconds).
    recent: tuple[tuple[int, float, float], ...] = ()

    @property
    def tokens_per_s(self) -> float:
        """Throughput over the recent steps, in engine time (the UI's pacing is not counted)."""
        seconds = sum(s + f for _, s, f in self.recent)
        return sum(t for t, _, _ in self.recent) / seconds if seconds > 0 else 0.0

    @property
    def mean_schedule_time(self) -> float:
        return sum(s for _, s, _ in self.recent) / len(self.recent) if self.recent else 0.0

    @property
    def mean_forward_time(self) -> float:
        return sum(f for _, _, f in self.recent) / len(self.recent) if self.recent else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted proposed tokens / proposed tokens."""
        if not self.num_draft_tokens:
            return 0.0
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verifying step gives its request: the accepted proposals plus one."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass(frozen=True)
class StepsState:
    """The step in progress, the last one done, the timeline and the running totals."""

    draft: StepRecord = field(default_factory=StepRecord)
    last_step: StepRecord | None = None
    timeline: tuple[TimelineColumn, ...] = ()
    metrics: Metrics = field(default_factory=Metrics)


def reduce_steps(
    steps: StepsState,
    event: Event,
    queues: QueuesState,
    kv: BlocksState,
    block_size: int,
    story: Story | None,
) -> StepsState:
    """The steps after `event`; `queues` and `kv` are those panels before it (read, never
    changed), `block_size` the engine's.

    The event joins the step in progress before it is applied, so the step a `StepSummary`
    closes holds every event of that step, the summary included. `story` tells the step.
    """
    draft = evolve(steps.draft, events=steps.draft.events + (event,), story=story)
    handler = _HANDLERS.get(type(event))
    if handler is None:
        return evolve(steps, draft=draft)
    return handler(evolve(steps, draft=draft), event, _Before(queues, kv, block_size))


class _Before(NamedTuple):
    """What the handlers read of the state before the event."""

    queues: QueuesState
    kv: BlocksState
    block_size: int


def _add(draft: StepRecord, **items: tuple) -> StepRecord:
    """`draft` with each item appended to the tuple field of its name."""
    return evolve(draft, **{name: getattr(draft, name) + item for name, item in items.items()})


def _count(metrics: Metrics, **counts: int) -> Metrics:
    """`metrics` with each count added to the field of its name."""
    return evolve(metrics, **{name: getattr(metrics, name) + n for name, n in counts.items()})


def _valid_block(before: _Before, block_id: int) -> bool:
    return 0 <= block_id < len(before.kv.blocks)


def _on_request_rejected(s: StepsState, e: RequestRejected, before: _Before) -> StepsState:
    return evolve(s, metrics=_count(s.metrics, num_rejected=1))


def _on_request_scheduled(s: StepsState, e: RequestScheduled, before: _Before) -> StepsState:
    info = before.queues.requests.get(e.request_id)
    if info is None:
        return s
    kind = (CHUNK if e.is_chunk else PREFILL) if e.is_prefill else DECODE
    if info.status == WAITING and kind == DECODE:
        # Admitted with all but one prompt token served by the prefix cache: the engine calls
        # that one token a decode, but for the request it is the prefill of its prompt.
        kind = PREFILL
    scheduled = (Scheduled(e.request_id, e.num_tokens, kind, e.num_computed_tokens),)
    draft = evolve(_add(s.draft, scheduled=scheduled), step=e.step)
    metrics = s.metrics
    if info.status == WAITING:  # admitted this step
        draft = _add(draft, admitted=(e.request_id,))
        metrics = _count(metrics, prefix_queries=info.num_tokens, prefix_hits=e.num_computed_tokens)
    return evolve(s, draft=draft, metrics=metrics)


def _on_request_preempted(s: StepsState, e: RequestPreempted, before: _Before) -> StepsState:
    if e.request_id not in before.queues.requests:
        return s
    draft = evolve(_add(s.draft, preempted=(e.request_id,)), step=e.step)
    return evolve(s, draft=draft, metrics=_count(s.metrics, num_preemptions=1))


def _on_token_emitted(s: StepsState, e: TokenEmitted, before: _Before) -> StepsState:
    return evolve(s, metrics=_count(s.metrics, num_output_tokens=1))


def _on_request_finished(s: StepsState, e: RequestFinished, before: _Before) -> StepsState:
    if e.request_id not in before.queues.requests:
        return s
    draft = _add(s.draft, finished=(e.request_id,))
    return evolve(s, draft=draft, metrics=_count(s.metrics, num_finished=1))


def _on_block_allocated(s: StepsState, e: BlockAllocated, before: _Before) -> StepsState:
    if not e.from_free_queue or not _valid_block(before, e.block_id):
        return s
    return evolve(s, draft=_add(s.draft, taken=(e.block_id,)))


def _on_cache_hit(s: StepsState, e: CacheHit, before: _Before) -> StepsState:
    free_queue = before.kv.free_queue
    if not _valid_block(before, e.block_id) or not e.was_free or e.block_id not in free_queue:
        return s
    at = free_queue.index(e.block_id)  # out of the middle of the free queue
    gap = (free_queue[at - 1] if at else None, e.block_id)
    return evolve(s, draft=_add(s.draft, pulled=(e.block_id,), gaps=(gap,)))


def _on_block_freed(s: StepsState, e: BlockFreed, before: _Before) -> StepsState:
    if not _valid_block(before, e.block_id):
        return s
    if e.ref_count != 0 or e.block_id in before.kv.free_queue:
        return s
    return evolve(s, draft=_add(s.draft, returned=(e.block_id,)))  # joins the tail


def _on_block_evicted(s: StepsState, e: BlockEvicted, before: _Before) -> StepsState:
    if not _valid_block(before, e.block_id):
        return s
    return evolve(s, draft=_add(s.draft, evicted=(e.block_id,)))


def _on_spec_tokens_verified(s: StepsState, e: SpecTokensVerified, before: _Before) -> StepsState:
    proposed, accepted = len(e.proposed), e.num_accepted
    metrics = _count(
        s.metrics, num_drafts=1, num_draft_tokens=proposed, num_accepted_tokens=accepted
    )
    draft = _add(s.draft, verified=((e.request_id, proposed, accepted),))
    return evolve(s, draft=draft, metrics=metrics)


def _on_kv_block_saved(s: StepsState, e: KVBlockSaved, before: _Before) -> StepsState:
    return evolve(s, draft=_add(s.draft, saved=((e.block_id, e.tier_slot),)))


def _on_kv_tier_evicted(s: StepsState, e: KVTierEvicted, before: _Before) -> StepsState:
    return evolve(s, draft=_add(s.draft, dropped=(e.tier_slot,)))


def _on_kv_block_loaded(s: StepsState, e: KVBlockLoaded, before: _Before) -> StepsState:
    # The request's admission counted these tokens as computed (`RequestScheduled`); they are
    # the connector's hits, not the prefix cache's (the scheduler counts them apart too).
    draft = _add(s.draft, loaded=((e.tier_slot, e.block_id),))
    return evolve(s, draft=draft, metrics=_count(s.metrics, prefix_hits=-before.block_size))


def _on_kv_load_failed(s: StepsState, e: KVLoadFailed, before: _Before) -> StepsState:
    return evolve(s, draft=_add(s.draft, load_failed=(e.request_id,)))


def _on_step_summary(s: StepsState, e: StepSummary, before: _Before) -> StepsState:
    record = evolve(s.draft, step=e.step, summary=e)
    cells: dict[str, str] = {}
    for rid in before.queues.waiting:
        cells[rid] = WAIT
    for scheduled in record.scheduled:
        cells[scheduled.request_id] = SPEC if scheduled.num_proposed else scheduled.kind
    for rid in record.preempted:
        cells[rid] = PREEMPTED
    column = TimelineColumn(e.step, MappingProxyType(cells))
    m = s.metrics
    tokens = e.num_prefill_tokens + e.num_decode_tokens
    metrics = evolve(
        m,
        num_steps=m.num_steps + 1,
        num_tokens=m.num_tokens + tokens,
        engine_time=m.engine_time + e.schedule_time + e.forward_time,
        recent=(m.recent + ((tokens, e.schedule_time, e.forward_time),))[-MAX_RECENT:],
    )
    timeline = (s.timeline + (column,))[-MAX_TIMELINE:]
    return StepsState(StepRecord(step=e.step + 1), record, timeline, metrics)


def _on_engine_snapshot(s: StepsState, e: EngineSnapshot, before: _Before) -> StepsState:
    """A late subscriber's start: the step count and the snapshot's totals replace ours."""
    metrics = Metrics(
        num_preemptions=e.num_preemptions,
        prefix_queries=e.prefix_cache_queries,
        prefix_hits=e.prefix_cache_hits,
    )
    draft = evolve(s.draft, step=e.step + 1)
    return StepsState(draft, StepRecord(step=e.step), (), metrics)


_HANDLERS: dict[type, Callable[[StepsState, Event, _Before], StepsState]] = {
    RequestRejected: _on_request_rejected,
    RequestScheduled: _on_request_scheduled,
    RequestPreempted: _on_request_preempted,
    TokenEmitted: _on_token_emitted,
    RequestFinished: _on_request_finished,
    BlockAllocated: _on_block_allocated,
    CacheHit: _on_cache_hit,
    BlockFreed: _on_block_freed,
    BlockEvicted: _on_block_evicted,
    SpecTokensVerified: _on_spec_tokens_verified,
    KVBlockSaved: _on_kv_block_saved,
    KVTierEvicted: _on_kv_tier_evicted,
    KVBlockLoaded: _on_kv_block_loaded,
    KVLoadFailed: _on_kv_load_failed,
    StepSummary: _on_step_summary,
    EngineSnapshot: _on_engine_snapshot,
}
