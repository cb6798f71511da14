"""The visualizer's model of the engine, rebuilt from events alone by a pure reducer.

`reduce(state, event) -> state` is the only way a `VizState` changes. It never mutates its
input: every field of a state is immutable (tuples, frozen dataclasses, read-only mappings), so
a widget can keep the state it last drew and tell what changed with an `is` check, a replay can
keep any earlier state, and the engine worker can hand states to the UI thread without locks.

A `VizState` is one state per panel, each with its own pure reducer in its own file:

    queues    queues.py    the requests, the waiting and running queues, the finished ones
    kv        blocks.py    every physical block and the free block queue
    steps     steps.py     the step in progress, the last one, the timeline, the totals
    tier      tier.py      the KV connector's second tier
    executor  executor.py  the model executor's latest step (and `attention_probe`)
    experts   experts.py   a mixture of experts' tokens per expert, the latest step and so far
    story     story.py     each step told in words, when a view asks (not in `reduce`)

`reduce` hands an event only to the panels it changes (the steps panel takes every event,
which joins the step in progress); the other panels stay the very same objects, and inside a
panel an event replaces only its own request's or block's entry. A panel reducer is handed its
own panel and, to read, never to change, only what it reads of the state before the event: the
queues read the blocks (the slot a cached block's request holds), the steps read the queues,
the blocks and the block size (a prefix hit's place in the free queue), the tier the step's
previous event and the pool's size. The fields the views read (`requests`, `blocks`, `draft`,
...) are properties of `VizState` that reach into its panels; the functions below this module
that read many of them (`figures.py`, `waiting.py`, `narrative.py`) take a `WholeState`
(`whole_state.py`), the protocol those properties meet.

Everything here comes from `nanovllm.events` and nothing else: the visualizer never looks inside
the scheduler or the KV cache manager. That is also what makes it a good test of the events: the
property tests run a real engine next to this reducer and check that both agree on the free
block queue's order, every block table, the queues and the block counts.

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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

from nanovllm.events import AttentionProbed, EngineStarted, Event
from nanovllm.viz.blocks import BLOCK_EVENTS, BlockInfo, BlocksState, fresh_blocks, reduce_blocks
from nanovllm.viz.executor import EXECUTOR_EVENTS, ExecutorStep, reduce_executor
from nanovllm.viz.experts import EXPERT_EVENTS, ExpertsState, reduce_experts
from nanovllm.viz.figures import (
    NO_CHANGES,
    Changes,
    ContiguousFigures,
    KVFigures,
    block_fill,
    contiguous_figures,
    family_of,
    kv_figures,
    last_block_fill,
    latest_changes,
    primary_group,
    primary_table,
    rank_forward_times,
    shown_step,
    table_holders,
)
from nanovllm.viz.queues import (
    FINISHED,
    MAX_FINISHED,
    MAX_REJECTED,
    NUM_SLOTS,
    QUEUE_EVENTS,
    RUNNING,
    WAITING,
    QueuesState,
    RequestInfo,
    free_slot,
    reduce_queues,
)
from nanovllm.viz.steps import (
    CHUNK,
    DECODE,
    MAX_RECENT,
    MAX_TIMELINE,
    PREEMPTED,
    PREFILL,
    SPEC,
    WAIT,
    Metrics,
    Scheduled,
    StepRecord,
    StepsState,
    TimelineColumn,
    reduce_steps,
)
from nanovllm.viz.story import StepStory
from nanovllm.viz.tier import TIER_EVENTS, TierState, reduce_tier, tier_from

__all__ = [
    "CHUNK",
    "DECODE",
    "FINISHED",
    "MAX_FINISHED",
    "MAX_RECENT",
    "MAX_REJECTED",
    "MAX_TIMELINE",
    "NO_CHANGES",
    "NUM_SLOTS",
    "PREEMPTED",
    "PREFILL",
    "RUNNING",
    "SPEC",
    "WAIT",
    "WAITING",
    "BlockInfo",
    "Changes",
    "ContiguousFigures",
    "KVFigures",
    "Metrics",
    "RequestInfo",
    "Scheduled",
    "StepRecord",
    "TimelineColumn",
    "VizState",
    "block_fill",
    "contiguous_figures",
    "family_of",
    "free_slot",
    "initial_state",
    "kv_figures",
    "last_block_fill",
    "latest_changes",
    "primary_group",
    "primary_table",
    "rank_forward_times",
    "reduce",
    "reduce_all",
    "shown_step",
    "table_holders",
]


@dataclass(frozen=True, init=False)
class VizState:
    """Everything the views draw, one state per panel. Build it with `initial_state()` and
    `reduce`."""

    engine: EngineStarted | None
    num_events: int
    queues: QueuesState
    kv: BlocksState
    steps: StepsState
    tier: TierState  # the KV connector's (`tier.py`)
    # The model executor's latest step: its flat inputs and the stage reached (`executor.py`).
    executor: ExecutorStep | None
    # What attention computed for one request in one layer, the latest the probe caught
    # (`attention_heat.py`; only while the executor panel is open in a live run).
    attention_probe: AttentionProbed | None
    # A mixture of experts' routing (`experts.py`; empty for a dense model).
    experts: ExpertsState

    def __init__(
        self,
        engine: EngineStarted | None = None,
        num_events: int = 0,
        queues: QueuesState | None = None,
        kv: BlocksState | None = None,
        steps: StepsState | None = None,
        tier: TierState | None = None,
        executor: ExecutorStep | None = None,
        attention_probe: AttentionProbed | None = None,
        experts: ExpertsState | None = None,
        **panel_fields,
    ) -> None:
        """`panel_fields`: fields of the panels by name (`VizState(running=..., waiting=...)`),
        for a view's test that needs a state no event sequence makes quickly."""
        panels = {"queues": queues, "kv": kv, "steps": steps}
        for name, value in panel_fields.items():
            if name not in _PANEL_OF:
                raise TypeError(f"VizState has no field {name!r}")
            panels[_PANEL_OF[name]] = replace(
                panels[_PANEL_OF[name]] or _PANELS[_PANEL_OF[name]](), **{name: value}
            )
        set_field = object.__setattr__  # frozen: fields are set once, here
        set_field(self, "engine", engine)
        set_field(self, "num_events", num_events)
        set_field(self, "queues", panels["queues"] or _NO_QUEUES)
        set_field(self, "kv", panels["kv"] or _NO_BLOCKS)
        set_field(self, "steps", panels["steps"] or _NO_STEPS)
        set_field(self, "tier", tier or _NO_TIER)
        set_field(self, "executor", executor)
        set_field(self, "attention_probe", attention_probe)
        set_field(self, "experts", experts or _NO_EXPERTS)

    # --- the queues panel ---
    @property
    def requests(self) -> Mapping[str, RequestInfo]:
        return self.queues.requests

    @property
    def waiting(self) -> tuple[str, ...]:
        """Front of the queue first."""
        return self.queues.waiting

    @property
    def running(self) -> tuple[str, ...]:
        """In admission order (the last one is preempted first)."""
        return self.queues.running

    @property
    def finished(self) -> tuple[str, ...]:
        """Most recent last, at most MAX_FINISHED."""
        return self.queues.finished

    @property
    def num_arrivals(self) -> int:
        return self.queues.num_arrivals

    @property
    def rejected(self) -> tuple[tuple[str, str], ...]:
        """(request id, reason), most recent last."""
        return self.queues.rejected

    @property
    def families(self) -> Mapping[str, tuple[str, ...]]:
        """Parallel sampling: parent id -> its children's ids by index."""
        return self.queues.families

    @property
    def last_added(self) -> str | None:
        return self.queues.last_added

    @property
    def waiting_reason(self) -> str | None:
        """Why the waiting requests wait, as the last `StepSummary` said (`waiting.py`)."""
        return self.queues.waiting_reason

    @property
    def waiting_head(self) -> str | None:
        return self.queues.waiting_head

    # --- the blocks panel ---
    @property
    def blocks(self) -> tuple[BlockInfo, ...]:
        return self.kv.blocks

    @property
    def free_queue(self) -> tuple[int, ...]:
        """Head first."""
        return self.kv.free_queue

    @property
    def null_block(self) -> int | None:
        return self.kv.null_block

    # --- the steps panel ---
    @property
    def draft(self) -> StepRecord:
        return self.steps.draft

    @property
    def last_step(self) -> StepRecord | None:
        return self.steps.last_step

    @property
    def timeline(self) -> tuple[TimelineColumn, ...]:
        return self.steps.timeline

    @property
    def metrics(self) -> Metrics:
        return self.steps.metrics

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
        return len(self.kv.blocks)


_PANELS = {"queues": QueuesState, "kv": BlocksState, "steps": StepsState}
_PANEL_OF = {f.name: panel for panel, cls in _PANELS.items() for f in fields(cls)}
_NO_QUEUES, _NO_BLOCKS, _NO_STEPS, _NO_TIER, _NO_EXPERTS = (
    QueuesState(),
    BlocksState(),
    StepsState(),
    TierState(),
    ExpertsState(),
)


def initial_state(started: EngineStarted | None = None) -> VizState:
    """The state of a fresh engine: every block free, the queue 0..N-1."""
    if started is None:
        return VizState()
    kv = fresh_blocks(started.num_kv_blocks, started.null_block)
    return VizState(engine=started, kv=kv, tier=tier_from(started))


def reduce(state: VizState, event: Event) -> VizState:
    """The state after `event`. Pure: `state` is left as it was.

    Unknown requests or blocks (a trace cut in the middle, say) are skipped, never an error: a
    visualizer must draw whatever it is given.
    """
    if isinstance(event, EngineStarted):
        started = initial_state(event)
        return VizState(started.engine, state.num_events + 1, kv=started.kv, tier=started.tier)
    # The first event of a step starts its story, told from the state before it (without
    # the steps behind it, which it does not need and would keep alive).
    story = state.draft.story
    if not state.draft.events:
        opening = StepsState(state.draft, None, (), state.metrics)
        story = StepStory(_with_steps(state, opening), _advance)
    return _apply(state, event, story)


def _advance(state: VizState, event: Event) -> VizState:
    """`reduce` for a story's replay (a step's events: no `EngineStarted`), told by no story."""
    return _apply(state, event, None)


def _apply(state: VizState, event: Event, story: StepStory[VizState] | None) -> VizState:
    """Each panel that `event` changes, reduced; the others kept as they are."""
    kind = type(event)
    return VizState(
        state.engine,
        state.num_events + 1,
        reduce_queues(state.queues, event, state.kv) if kind in QUEUE_EVENTS else state.queues,
        reduce_blocks(state.kv, event) if kind in BLOCK_EVENTS else state.kv,
        reduce_steps(state.steps, event, state.queues, state.kv, state.block_size, story),
        _reduce_tier(state, event) if kind in TIER_EVENTS else state.tier,
        reduce_executor(state.executor, event) if kind in EXECUTOR_EVENTS else state.executor,
        event if kind is AttentionProbed else state.attention_probe,
        reduce_experts(state.experts, event) if kind in EXPERT_EVENTS else state.experts,
    )


def _reduce_tier(state: VizState, event: Event) -> TierState:
    """The tier panel after `event`, handed what it reads of `state`."""
    previous = state.draft.events[-1] if state.draft.events else None
    return reduce_tier(state.tier, event, previous, state.num_blocks)


def _with_steps(state: VizState, steps: StepsState) -> VizState:
    return VizState(
        state.engine,
        state.num_events,
        state.queues,
        state.kv,
        steps,
        state.tier,
        state.executor,
        state.attention_probe,
        state.experts,
    )


def reduce_all(state: VizState, events: Iterable[Event]) -> VizState:
    for event in events:
        state = reduce(state, event)
    return state
