"""The visualizer's model of the engine, rebuilt from events alone by a pure reducer.

`reduce(state, event) -> state` is the only way a `VizState` changes. It never mutates its
input: every field of a state is immutable (tuples, frozen dataclasses, read-only mappings), so
a widget can keep the state it last drew and tell what changed with an `is` check, a replay can
keep any earlier state, and the engine worker can hand states to the UI thread without locks.

Everything here comes from `nanovllm.events` and nothing else: the visualizer never looks inside
the scheduler or the KV cache manager. That is also what makes it a good test of the events: the
property tests run a real engine next to this reducer and check that both agree on the free
block queue's order, every block table, the queues and the block counts.

How the free block queue is rebuilt (see `nanovllm.events`): it starts as 0..N-1 from head to
tail; `BlockAllocated` takes the head (after a `BlockEvicted` when that block still held a cached
prefix), `CacheHit(was_free=True)` pulls a block out of the middle, and `BlockFreed` with
`ref_count == 0` appends it at the tail.

Events that arrive between two `StepSummary` events belong to the step in progress (`draft`);
the summary closes it into `last_step` and one more column of the batch timeline.

Speculative decoding: a decoding request with proposals is scheduled for 1 + k tokens, so its
`num_computed_tokens` counts the proposals' slots too; `SpecTokensVerified` then steps it back
over the rejected ones (as the scheduler does), and the `BlockFreed` events that follow, for
blocks that held only rejected slots, take those blocks out of the request's block table while
it keeps running. Parallel sampling: children of one parent are grouped as a family
(`families.py`). A KV connector's tier (`tier.py`): the slots, their LRU order and the
counts live in `VizState.tier`, each step's saves and loads in its `StepRecord`; tokens loaded
from the connector are taken out of the prefix-cache hits (the scheduler counts them apart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from nanovllm.events import (
    AttentionProbed,
    BlockAllocated,
    BlockCached,
    BlockEvicted,
    BlockFreed,
    CacheHit,
    EngineSnapshot,
    EngineStarted,
    Event,
    GrammarMasked,
    KVBlockLoaded,
    KVBlockSaved,
    KVLoadFailed,
    KVTierEvicted,
    KVWritten,
    RequestAdded,
    RequestFinished,
    RequestPreempted,
    RequestRejected,
    RequestScheduled,
    SpecTokensVerified,
    StepSummary,
    TokenEmitted,
)
from nanovllm.viz import tier as tiers
from nanovllm.viz.executor import EXECUTOR_EVENTS, ExecutorStep, reduce_executor
from nanovllm.viz.families import follows, group_children, parse_child_id
from nanovllm.viz.narrative import Note, add_note, narrate
from nanovllm.viz.tier import TierState, tier_from

# Request status, as the visualizer tells it.
WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"

# What a request did in one step: one cell of the batch timeline.
PREFILL = "prefill"  # the (last piece of the) prompt was computed and a token sampled
CHUNK = "chunk"  # a piece of a prompt too long for the step's token budget
DECODE = "decode"  # one token in, one token out
SPEC = "spec"  # a decode with proposed tokens to verify: 1 + k tokens in, 1 to k + 1 out
PREEMPTED = "preempted"  # lost its blocks this step, back to the waiting queue
WAIT = "waiting"  # in the waiting queue, not scheduled

# Bounds, so a demo that runs for hours keeps a constant cost per event.
MAX_TIMELINE = 400  # steps of history kept for the timeline
MAX_FINISHED = 40  # finished requests kept (with their text) for the queue view
MAX_RECENT = 20  # steps in the moving averages (tokens/s, step time)
MAX_REJECTED = 5

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class RequestInfo:
    """One request, as far as events tell."""

    request_id: str
    index: int  # arrival order from 0: orders the timeline's rows
    prompt: str | None
    num_prompt_tokens: int
    max_tokens: int
    status: str = WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (after the last step)
    num_output_tokens: int = 0
    output_text: str = ""
    block_table: tuple[int, ...] = ()  # logical block i lives in physical block block_table[i]
    tokens: tuple[str, ...] = ()  # text of each token (prompt, then output) when events tell
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at its last admission
    num_preemptions: int = 0
    finish_reason: str | None = None
    # Speculative decoding: tokens proposed for it and accepted, and where the accepted ones
    # sit: (position of the first, how many) per verification that accepted any.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted: tuple[tuple[int, int], ...] = ()
    # Structured outputs: how many tokens its grammar allowed at its last masked step (per
    # logits row: 1 + the proposals verified), and of how many; None: never masked.
    grammar_allowed: tuple[int, ...] | None = None
    vocab_size: int = 0
    # Picks its colour and letter (`style.py`): at arrival, the lowest that no live request
    # and no cached prefix's request holds (`free_slot`), so letters on screen do not repeat.
    slot: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    def accepted_positions(self) -> frozenset[int]:
        """Positions (in prompt + output) of the tokens that were accepted proposals."""
        return frozenset(t for start, n in self.accepted for t in range(start, start + n))


@dataclass(frozen=True)
class BlockInfo:
    """One physical KV block. In the free queue exactly when `ref_count == 0`."""

    ref_count: int = 0
    owners: tuple[str, ...] = ()  # requests holding it, in the order they took it
    block_hash: str | None = None  # set while it is registered in the prefix cache
    last_owner: str | None = None  # who held it last
    cached_by: str | None = None  # the request that registered its prefix (None: not known)

    @property
    def cached(self) -> bool:
        return self.block_hash is not None


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
    notes: tuple[Note, ...] = ()  # the step told in words (see `narrative.py`)
    summary: StepSummary | None = None

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


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
class VizState:
    """Everything the views draw. Build it with `initial_state()` and `reduce`."""

    engine: EngineStarted | None = None
    num_events: int = 0
    requests: Mapping[str, RequestInfo] = field(default_factory=lambda: _EMPTY)
    waiting: tuple[str, ...] = ()  # front of the queue first
    running: tuple[str, ...] = ()  # in admission order (the last one is preempted first)
    finished: tuple[str, ...] = ()  # most recent last, at most MAX_FINISHED
    blocks: tuple[BlockInfo, ...] = ()
    free_queue: tuple[int, ...] = ()  # head first
    draft: StepRecord = field(default_factory=StepRecord)
    last_step: StepRecord | None = None
    timeline: tuple[TimelineColumn, ...] = ()
    metrics: Metrics = field(default_factory=Metrics)
    num_arrivals: int = 0
    rejected: tuple[tuple[str, str], ...] = ()  # (request id, reason), most recent last
    # Parallel sampling: parent id -> its children's ids by index (families of two or more).
    families: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    last_added: str | None = None  # the latest RequestAdded's id (children arrive in a row)
    tier: TierState = field(default_factory=TierState)  # the KV connector's (`tier.py`)
    # The model executor's latest step: its flat inputs and the stage reached (`executor.py`).
    executor: ExecutorStep | None = None
    # What attention computed for one request in one layer, the latest the probe caught
    # (`attention_heat.py`; only while the executor panel is open in a live run).
    attention_probe: AttentionProbed | None = None
    # Why the waiting requests wait, as the last `StepSummary` said (`waiting.py`).
    waiting_reason: str | None = None
    waiting_head: str | None = None

    @property
    def step(self) -> int:
        """The last completed step (0 before the first)."""
        return self.last_step.step if self.last_step else 0

    @property
    def block_size(self) -> int:
        return self.engine.block_size if self.engine else 1

    @property
    def tensor_parallel_size(self) -> int:
        """The engine's ranks: each holds a slice of every layer (1: no tensor parallelism)."""
        return self.engine.tensor_parallel_size if self.engine else 1

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


def initial_state(started: EngineStarted | None = None) -> VizState:
    """The state of a fresh engine: every block free, the queue 0..N-1."""
    if started is None:
        return VizState()
    n = started.num_kv_blocks
    return VizState(
        engine=started,
        blocks=(BlockInfo(),) * n,
        free_queue=tuple(range(n)),
        tier=tier_from(started),
    )


# --- figures derived from a state (the same ones the engine reports) --------------------------


@dataclass(frozen=True)
class KVFigures:
    num_used_blocks: int
    num_free_blocks: int
    num_cached_free_blocks: int
    num_shared_blocks: int
    num_allocated_slots: int
    num_filled_slots: int

    @property
    def fragmentation(self) -> float:
        """Share of allocated slots that hold no token (internal fragmentation)."""
        if not self.num_allocated_slots:
            return 0.0
        return 1 - self.num_filled_slots / self.num_allocated_slots


def kv_figures(state: VizState) -> KVFigures:
    """Block and slot counts, computed from the rebuilt state alone."""
    free = len(state.free_queue)
    cached_free = sum(1 for b in state.free_queue if state.blocks[b].cached)
    shared = sum(1 for b in state.blocks if b.ref_count > 1)
    extra_refs = sum(b.ref_count - 1 for b in state.blocks if b.ref_count > 1)
    used = state.num_blocks - free
    filled = sum(
        state.requests[r].num_computed_tokens for r in state.running if r in state.requests
    )
    # A shared block's slots are counted once, as the engine does.
    filled -= extra_refs * state.block_size
    return KVFigures(used, free, cached_free, shared, used * state.block_size, filled)


@dataclass(frozen=True)
class ContiguousFigures:
    """The same running requests in a cache without paging: each one reserves `max_model_len`
    contiguous slots up front (what the PagedAttention paper compares against)."""

    num_requests: int
    num_reserved_slots: int
    num_filled_slots: int  # no sharing: a prefix used by two requests is stored twice
    num_fit: int  # reservations the same memory holds

    @property
    def fragmentation(self) -> float:
        """Share of reserved slots that hold no token."""
        if not self.num_reserved_slots:
            return 0.0
        return 1 - self.num_filled_slots / self.num_reserved_slots


def contiguous_figures(state: VizState) -> ContiguousFigures:
    """What a contiguous `max_model_len` reservation per running request would hold."""
    max_len = state.engine.max_model_len if state.engine else 0
    running = [state.requests[r] for r in state.running if r in state.requests]
    filled = sum(min(r.num_computed_tokens, max_len) for r in running)
    capacity = state.num_blocks * state.block_size
    return ContiguousFigures(
        len(running), len(running) * max_len, filled, capacity // max_len if max_len else 0
    )


def rank_forward_times(state: VizState) -> tuple[float, ...]:
    """Each tensor-parallel rank's forward time in the last step done, in rank order (seconds);
    () without tensor parallelism or before the first step. The reducer keeps the step's
    `StepSummary`, which carries them."""
    summary = state.last_step.summary if state.last_step else None
    if state.tensor_parallel_size < 2 or summary is None:
        return ()
    return summary.rank_forward_times


def table_holders(state: VizState) -> tuple[str, ...]:
    """Requests whose block tables the views list: the running ones in admission order, then
    the ones being admitted in this step (still in the waiting queue, but already holding the
    blocks the scheduler just gave them)."""
    admitting = tuple(
        r for r in state.waiting if r in state.requests and state.requests[r].block_table
    )
    return state.running + admitting


def block_fill(state: VizState, request: RequestInfo, logical: int) -> int:
    """How many slots of `request`'s logical block `logical` hold a token's K and V."""
    used = request.num_computed_tokens - logical * state.block_size
    return max(0, min(used, state.block_size))


def last_block_fill(state: VizState, request: RequestInfo) -> int:
    """How many of the slots of `request`'s last block hold a token's K and V."""
    if not request.block_table:
        return 0
    return block_fill(state, request, len(request.block_table) - 1)


def family_of(state: VizState, request_id: str) -> tuple[str, tuple[str, ...]] | None:
    """(parent id, every child's id) when `request_id` is a child of parallel sampling."""
    child = parse_child_id(request_id)
    if child is None:
        return None
    members = state.families.get(child[1], ())
    return (child[1], members) if request_id in members else None


def shown_step(state: VizState) -> StepRecord | None:
    """The step the views describe: the one being played (mid-step), else the last one done."""
    return state.draft if state.draft.scheduled or state.draft.preempted else state.last_step


@dataclass(frozen=True)
class Changes:
    """What the latest move changed: the views flash these."""

    blocks: frozenset[int] = frozenset()
    requests: frozenset[str] = frozenset()


NO_CHANGES = Changes()


def latest_changes(state: VizState) -> Changes:
    """Mid-step: what the last event touched. At a step boundary: everything the step did."""
    events = state.draft.events[-1:] if state.draft.events else ()
    if not events and state.last_step is not None:
        events = state.last_step.events
    blocks: set[int] = set()
    requests: set[str] = set()
    for event in events:
        block_id = getattr(event, "block_id", None)
        if block_id is not None:
            blocks.add(block_id)
        request_id = getattr(event, "request_id", None)
        if request_id is not None:
            requests.add(request_id)
        if isinstance(event, KVWritten):  # the blocks whose slots the step's K/V went to
            blocks.update(slot // state.block_size for slot in event.slot_mapping)
    if not blocks and not requests:
        return NO_CHANGES
    return Changes(frozenset(blocks), frozenset(requests))


# --- the reducer --------------------------------------------------------------------------------


def reduce(state: VizState, event: Event) -> VizState:
    """The state after `event`. Pure: `state` is left as it was.

    Unknown requests or blocks (a trace cut in the middle, say) are skipped, never an error: a
    visualizer must draw whatever it is given.
    """
    if isinstance(event, EngineStarted):
        return replace(initial_state(event), num_events=state.num_events + 1)
    # The event joins the step in progress (told in words too) before it is applied, so the
    # step a `StepSummary` closes holds every event of that step, the summary included.
    draft = state.draft
    draft = replace(
        draft, events=draft.events + (event,), notes=add_note(draft.notes, narrate(state, event))
    )
    state = replace(state, draft=draft, num_events=state.num_events + 1)
    handler = _HANDLERS.get(type(event))
    return handler(state, event) if handler is not None else state


def reduce_all(state: VizState, events: Iterable[Event]) -> VizState:
    for event in events:
        state = reduce(state, event)
    return state


def _set_request(state: VizState, info: RequestInfo) -> Mapping[str, RequestInfo]:
    return MappingProxyType({**state.requests, info.request_id: info})


def _set_block(blocks: tuple[BlockInfo, ...], block_id: int, info: BlockInfo) -> tuple:
    return blocks[:block_id] + (info,) + blocks[block_id + 1 :]


def _valid_block(state: VizState, block_id: int) -> bool:
    return 0 <= block_id < len(state.blocks)


def _without(items: tuple, item: object) -> tuple:
    if item not in items:
        return items
    i = items.index(item)
    return items[:i] + items[i + 1 :]


NUM_SLOTS = 36  # letters in `style.GLYPHS`


def free_slot(state: VizState) -> int:
    """The slot (colour and letter) for a new request: the lowest that no waiting or running
    request holds, nor the request whose cached prefix a block keeps; if possible none that a
    listed finished request holds either."""
    live = {r.slot for r in state.requests.values() if r.status != FINISHED}
    cached = {
        state.requests[b.cached_by].slot
        for b in state.blocks
        if b.cached and b.cached_by in state.requests
    }
    listed = {r.slot for r in state.requests.values()}
    for avoid in (live | cached | listed, live | cached, live):
        for slot in range(NUM_SLOTS):
            if slot not in avoid:
                return slot
    return state.num_arrivals % NUM_SLOTS


def _on_request_added(state: VizState, e: RequestAdded) -> VizState:
    info = RequestInfo(
        request_id=e.request_id,
        index=state.num_arrivals,
        slot=free_slot(state),
        prompt=e.prompt,
        num_prompt_tokens=e.num_prompt_tokens,
        max_tokens=e.max_tokens,
        tokens=e.prompt_tokens,
    )
    families = state.families
    parent = follows(state.last_added, e.request_id)
    if parent is not None:
        members = families.get(parent, ())
        if not members or members[-1] != state.last_added:  # child 1: a new family
            members = (state.last_added,)
        families = MappingProxyType({**families, parent: members + (e.request_id,)})
    return replace(
        state,
        requests=_set_request(state, info),
        waiting=state.waiting + (e.request_id,),
        num_arrivals=state.num_arrivals + 1,
        families=families,
        last_added=e.request_id,
    )


def _on_request_rejected(state: VizState, e: RequestRejected) -> VizState:
    # The request never entered the engine (its id may even belong to another request).
    rejected = (state.rejected + ((e.request_id, e.reason),))[-MAX_REJECTED:]
    metrics = replace(state.metrics, num_rejected=state.metrics.num_rejected + 1)
    return replace(state, rejected=rejected, metrics=metrics)


def _on_request_scheduled(state: VizState, e: RequestScheduled) -> VizState:
    info = state.requests.get(e.request_id)
    if info is None:
        return state
    kind = (CHUNK if e.is_chunk else PREFILL) if e.is_prefill else DECODE
    if info.status == WAITING and kind == DECODE:
        # Admitted with all but one prompt token served by the prefix cache: the engine calls
        # that one token a decode, but for the request it is the prefill of its prompt.
        kind = PREFILL
    draft = state.draft
    draft = replace(
        draft,
        step=e.step,
        scheduled=draft.scheduled
        + (Scheduled(e.request_id, e.num_tokens, kind, e.num_computed_tokens),),
    )
    waiting, running, metrics = state.waiting, state.running, state.metrics
    new_info = replace(info, num_computed_tokens=e.num_computed_tokens + e.num_tokens)
    if info.status == WAITING:  # admitted this step
        waiting = _without(waiting, e.request_id)
        running = running + (e.request_id,)
        draft = replace(draft, admitted=draft.admitted + (e.request_id,))
        new_info = replace(new_info, status=RUNNING, num_cached_tokens=e.num_computed_tokens)
        metrics = replace(
            metrics,
            prefix_queries=metrics.prefix_queries + info.num_tokens,
            prefix_hits=metrics.prefix_hits + e.num_computed_tokens,
        )
    return replace(
        state,
        requests=_set_request(state, new_info),
        waiting=waiting,
        running=running,
        draft=draft,
        metrics=metrics,
    )


def _on_request_preempted(state: VizState, e: RequestPreempted) -> VizState:
    info = state.requests.get(e.request_id)
    if info is None:
        return state
    new_info = replace(
        info,
        status=WAITING,
        num_computed_tokens=0,
        block_table=(),
        num_preemptions=info.num_preemptions + 1,
    )
    draft = replace(state.draft, step=e.step, preempted=state.draft.preempted + (e.request_id,))
    metrics = replace(state.metrics, num_preemptions=state.metrics.num_preemptions + 1)
    return replace(
        state,
        requests=_set_request(state, new_info),
        running=_without(state.running, e.request_id),
        waiting=(e.request_id,) + _without(state.waiting, e.request_id),  # back to the front
        draft=draft,
        metrics=metrics,
    )


def _on_token_emitted(state: VizState, e: TokenEmitted) -> VizState:
    info = state.requests.get(e.request_id)
    metrics = replace(state.metrics, num_output_tokens=state.metrics.num_output_tokens + 1)
    if info is None:
        return replace(state, metrics=metrics)
    new_info = replace(
        info,
        num_output_tokens=e.num_output_tokens,
        output_text=info.output_text + e.text_delta,
        tokens=info.tokens + (e.text_delta,) if info.tokens else (),
    )
    return replace(state, requests=_set_request(state, new_info), metrics=metrics)


def _on_request_finished(state: VizState, e: RequestFinished) -> VizState:
    info = state.requests.get(e.request_id)
    if info is None:
        return state
    new_info = replace(
        info,
        status=FINISHED,
        finish_reason=e.finish_reason,
        num_output_tokens=e.num_output_tokens,
        block_table=(),
    )
    requests = dict(state.requests)
    requests[e.request_id] = new_info
    finished = state.finished + (e.request_id,)
    families = state.families
    if len(finished) > MAX_FINISHED:  # forget the oldest finished requests
        for old in finished[:-MAX_FINISHED]:
            requests.pop(old, None)
        finished = finished[-MAX_FINISHED:]
        families = MappingProxyType(
            {p: ids for p, ids in families.items() if any(r in requests for r in ids)}
        )
    draft = replace(state.draft, finished=state.draft.finished + (e.request_id,))
    metrics = replace(state.metrics, num_finished=state.metrics.num_finished + 1)
    return replace(
        state,
        requests=MappingProxyType(requests),
        running=_without(state.running, e.request_id),
        waiting=_without(state.waiting, e.request_id),
        finished=finished,
        draft=draft,
        metrics=metrics,
        families=families,
    )


def _append_to_table(
    state: VizState, request_id: str, block_id: int, logical_index: int
) -> Mapping[str, RequestInfo]:
    info = state.requests.get(request_id)
    if info is None:
        return state.requests
    table = info.block_table[:logical_index] + (block_id,)
    return _set_request(state, replace(info, block_table=table))


def _on_block_allocated(state: VizState, e: BlockAllocated) -> VizState:
    if not _valid_block(state, e.block_id):
        return state
    draft = state.draft
    if e.from_free_queue:  # off the head of the free queue, when events are consistent
        draft = replace(draft, taken=draft.taken + (e.block_id,))
        before = draft.events[-2] if len(draft.events) >= 2 else None
        if isinstance(before, BlockEvicted) and before.block_id == e.block_id:
            # The pool hands out a block still caching a prefix: the tier saves it at the end
            # of scheduling (only these evictions; a failed step's uncaching is not one).
            state = replace(state, tier=tiers.pool_evicted(state.tier, before.block_hash))
    ref_count = state.blocks[e.block_id].ref_count + 1
    return _give_block(
        state, e.request_id, e.block_id, e.logical_index, ref_count, e.from_free_queue, draft
    )


def _on_cache_hit(state: VizState, e: CacheHit) -> VizState:
    if not _valid_block(state, e.block_id):
        return state
    draft = state.draft
    if e.was_free and e.block_id in state.free_queue:  # out of the middle of the free queue
        at = state.free_queue.index(e.block_id)
        before = state.free_queue[at - 1] if at else None
        draft = replace(
            draft, pulled=draft.pulled + (e.block_id,), gaps=draft.gaps + ((before, e.block_id),)
        )
    return _give_block(
        state, e.request_id, e.block_id, e.logical_index, e.ref_count, e.was_free, draft
    )


def _give_block(
    state: VizState,
    request_id: str,
    block_id: int,
    logical_index: int,
    ref_count: int,
    left_free_queue: bool,
    draft: StepRecord,
) -> VizState:
    """`request_id` now holds `block_id` as its logical block `logical_index`."""
    block = state.blocks[block_id]
    new_block = replace(
        block, ref_count=ref_count, owners=block.owners + (request_id,), last_owner=request_id
    )
    free_queue = _without(state.free_queue, block_id) if left_free_queue else state.free_queue
    return replace(
        state,
        blocks=_set_block(state.blocks, block_id, new_block),
        free_queue=free_queue,
        requests=_append_to_table(state, request_id, block_id, logical_index),
        draft=draft,
    )


def _on_block_freed(state: VizState, e: BlockFreed) -> VizState:
    if not _valid_block(state, e.block_id):
        return state
    block = state.blocks[e.block_id]
    new_block = replace(block, ref_count=e.ref_count, owners=_without(block.owners, e.request_id))
    free_queue, draft = state.free_queue, state.draft
    if e.ref_count == 0 and e.block_id not in free_queue:
        free_queue = free_queue + (e.block_id,)  # joins the tail
        draft = replace(draft, returned=draft.returned + (e.block_id,))
    # Out of the request's block table: a finishing or preempted request's table empties
    # block by block (tail first), and a running request loses the blocks that held only its
    # rejected proposals.
    requests = state.requests
    info = requests.get(e.request_id)
    if info is not None and e.block_id in info.block_table:
        table = _without(info.block_table, e.block_id)
        requests = _set_request(state, replace(info, block_table=table))
    return replace(
        state,
        blocks=_set_block(state.blocks, e.block_id, new_block),
        free_queue=free_queue,
        requests=requests,
        draft=draft,
    )


def _on_block_cached(state: VizState, e: BlockCached) -> VizState:
    if not _valid_block(state, e.block_id):
        return state
    new_block = replace(state.blocks[e.block_id], block_hash=e.block_hash, cached_by=e.request_id)
    return replace(state, blocks=_set_block(state.blocks, e.block_id, new_block))


def _on_block_evicted(state: VizState, e: BlockEvicted) -> VizState:
    if not _valid_block(state, e.block_id):
        return state
    new_block = replace(state.blocks[e.block_id], block_hash=None, cached_by=None)
    draft = replace(state.draft, evicted=state.draft.evicted + (e.block_id,))
    return replace(state, blocks=_set_block(state.blocks, e.block_id, new_block), draft=draft)


def _on_spec_tokens_verified(state: VizState, e: SpecTokensVerified) -> VizState:
    """The first `num_accepted` proposals were accepted: the rest are rolled back."""
    proposed, accepted = len(e.proposed), e.num_accepted
    m = state.metrics
    metrics = replace(
        m,
        num_drafts=m.num_drafts + 1,
        num_draft_tokens=m.num_draft_tokens + proposed,
        num_accepted_tokens=m.num_accepted_tokens + accepted,
    )
    draft = replace(
        state.draft, verified=state.draft.verified + ((e.request_id, proposed, accepted),)
    )
    info = state.requests.get(e.request_id)
    if info is None:
        return replace(state, metrics=metrics, draft=draft)
    # The accepted tokens come next, as the request's next output tokens (`TokenEmitted`).
    spans = info.accepted + ((info.num_tokens, accepted),) if accepted else info.accepted
    new_info = replace(
        info,
        num_computed_tokens=max(0, info.num_computed_tokens - (proposed - accepted)),
        num_draft_tokens=info.num_draft_tokens + proposed,
        num_accepted_tokens=info.num_accepted_tokens + accepted,
        accepted=spans,
    )
    return replace(state, requests=_set_request(state, new_info), metrics=metrics, draft=draft)


def _on_grammar_masked(state: VizState, e: GrammarMasked) -> VizState:
    """Each structured request's latest mask: how many tokens its grammar allowed."""
    for rid, counts in e.allowed.items():
        info = state.requests.get(rid)
        if info is not None:
            info = replace(info, grammar_allowed=counts, vocab_size=e.vocab_size)
            state = replace(state, requests=_set_request(state, info))
    return state


def _on_kv_block_saved(state: VizState, e: KVBlockSaved) -> VizState:
    draft = replace(state.draft, saved=state.draft.saved + ((e.block_id, e.tier_slot),))
    return replace(state, tier=tiers.saved(state.tier, e.block_hash, e.tier_slot), draft=draft)


def _on_kv_tier_evicted(state: VizState, e: KVTierEvicted) -> VizState:
    draft = replace(state.draft, dropped=state.draft.dropped + (e.tier_slot,))
    return replace(state, tier=tiers.dropped(state.tier, e.block_hash, e.tier_slot), draft=draft)


def _on_kv_block_loaded(state: VizState, e: KVBlockLoaded) -> VizState:
    draft = replace(state.draft, loaded=state.draft.loaded + ((e.tier_slot, e.block_id),))
    # The request's admission counted these tokens as computed (`RequestScheduled`); they are
    # the connector's hits, not the prefix cache's (the scheduler counts them apart too).
    m = state.metrics
    metrics = replace(m, prefix_hits=m.prefix_hits - state.block_size)
    return replace(
        state,
        tier=tiers.loaded(state.tier, e.block_hash, e.tier_slot),
        draft=draft,
        metrics=metrics,
    )


def _on_kv_load_failed(state: VizState, e: KVLoadFailed) -> VizState:
    draft = replace(state.draft, load_failed=state.draft.load_failed + (e.request_id,))
    return replace(state, tier=tiers.load_failed(state.tier, e.request_id, e.error), draft=draft)


def _on_step_summary(state: VizState, e: StepSummary) -> VizState:
    record = replace(state.draft, step=e.step, summary=e)
    cells: dict[str, str] = {}
    for rid in state.waiting:
        cells[rid] = WAIT
    for s in record.scheduled:
        cells[s.request_id] = SPEC if s.num_proposed else s.kind
    for rid in record.preempted:
        cells[rid] = PREEMPTED
    column = TimelineColumn(e.step, MappingProxyType(cells))
    m = state.metrics
    tokens = e.num_prefill_tokens + e.num_decode_tokens
    metrics = replace(
        m,
        num_steps=m.num_steps + 1,
        num_tokens=m.num_tokens + tokens,
        engine_time=m.engine_time + e.schedule_time + e.forward_time,
        recent=(m.recent + ((tokens, e.schedule_time, e.forward_time),))[-MAX_RECENT:],
    )
    return replace(
        state,
        last_step=record,
        draft=StepRecord(step=e.step + 1),
        timeline=(state.timeline + (column,))[-MAX_TIMELINE:],
        metrics=metrics,
        tier=tiers.end_step(state.tier),
        waiting_reason=e.waiting_reason,
        waiting_head=e.waiting_head,
    )


def _on_engine_snapshot(state: VizState, e: EngineSnapshot) -> VizState:
    """A late subscriber's start: the engine's state replaces ours (the engine's shape stays)."""
    owners: dict[int, tuple[str, ...]] = {}
    requests: dict[str, RequestInfo] = {}
    order = {rid: i for i, rid in enumerate((*e.running, *e.waiting))}
    for r in sorted(e.requests, key=lambda r: order.get(r.request_id, len(order))):
        for block_id in r.block_table:
            owners[block_id] = owners.get(block_id, ()) + (r.request_id,)
        requests[r.request_id] = RequestInfo(
            request_id=r.request_id,
            index=len(requests),
            slot=len(requests) % NUM_SLOTS,
            prompt=r.prompt,
            num_prompt_tokens=r.num_prompt_tokens,
            max_tokens=r.max_tokens,
            status=RUNNING if r.status == RUNNING else WAITING,
            num_computed_tokens=r.num_computed_tokens,
            num_output_tokens=r.num_output_tokens,
            output_text=r.output_text,
            block_table=r.block_table,
            tokens=r.tokens,
            num_cached_tokens=r.num_cached_tokens,
            num_preemptions=r.num_preemptions,
        )
    blocks = tuple(
        BlockInfo(
            ref_count=b.ref_count,
            owners=owners.get(b.block_id, ()),
            block_hash=b.block_hash,
            last_owner=owners.get(b.block_id, (None,))[-1],
        )
        for b in sorted(e.blocks, key=lambda b: b.block_id)
    )
    metrics = replace(
        Metrics(),
        num_preemptions=e.num_preemptions,
        prefix_queries=e.prefix_cache_queries,
        prefix_hits=e.prefix_cache_hits,
    )
    return replace(
        state,
        requests=MappingProxyType(requests),
        waiting=tuple(r for r in e.waiting if r in requests),
        running=tuple(r for r in e.running if r in requests),
        finished=(),
        blocks=blocks,
        free_queue=e.free_queue,
        draft=replace(state.draft, step=e.step + 1),
        last_step=StepRecord(step=e.step),
        timeline=(),
        metrics=metrics,
        num_arrivals=len(requests),
        rejected=(),
        families=MappingProxyType(group_children(requests)),
        last_added=None,
        tier=tiers.from_snapshot(state.tier, e.tier),
    )


def _on_executor_event(state: VizState, e: Event) -> VizState:
    return replace(state, executor=reduce_executor(state.executor, e))


_HANDLERS: dict[type, Callable[[VizState, Event], VizState]] = {
    **{cls: _on_executor_event for cls in EXECUTOR_EVENTS},
    AttentionProbed: lambda state, e: replace(state, attention_probe=e),
    EngineSnapshot: _on_engine_snapshot,
    RequestAdded: _on_request_added,
    RequestRejected: _on_request_rejected,
    RequestScheduled: _on_request_scheduled,
    RequestPreempted: _on_request_preempted,
    TokenEmitted: _on_token_emitted,
    RequestFinished: _on_request_finished,
    BlockAllocated: _on_block_allocated,
    CacheHit: _on_cache_hit,
    BlockFreed: _on_block_freed,
    BlockCached: _on_block_cached,
    BlockEvicted: _on_block_evicted,
    SpecTokensVerified: _on_spec_tokens_verified,
    GrammarMasked: _on_grammar_masked,
    KVBlockSaved: _on_kv_block_saved,
    KVTierEvicted: _on_kv_tier_evicted,
    KVBlockLoaded: _on_kv_block_loaded,
    KVLoadFailed: _on_kv_load_failed,
    StepSummary: _on_step_summary,
}
