"""Figures a view reads off a `VizState`: block and slot counts, the step to describe, what
the latest move changed.

They are computed from the state alone, never kept in it: the reducer stays the only writer, and
a view asks for what it draws. `kv_figures` gives the same counts the engine reports, which is
what the property tests compare. `state.py` offers them beside the state, so they read it as a
`WholeState` (`whole_state.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanovllm.events import KVWritten
from nanovllm.viz.families import parse_child_id

if TYPE_CHECKING:
    from nanovllm.viz.queues import RequestInfo
    from nanovllm.viz.steps import StepRecord
    from nanovllm.viz.whole_state import WholeState


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


def kv_figures(state: WholeState) -> KVFigures:
    """Block and slot counts, computed from the rebuilt state alone."""
    free = len(state.free_queue)
    cached_free = sum(1 for b in state.free_queue if state.blocks[b].cached)
    shared = sum(1 for b in state.blocks if b.ref_count > 1)
    extra_refs = sum(b.ref_count - 1 for b in state.blocks if b.ref_count > 1)
    used = state.num_blocks - free - (state.null_block is not None)  # (the null block: unused)
    running = [state.requests[r] for r in state.running if r in state.requests]
    # Every KV cache group holds each computed token's KV, but for the tokens a sliding
    # window passed (its null blocks); a shared block's slots are counted once, as the engine
    # does.
    groups = state.engine.kv_cache_groups if state.engine is not None else ()
    filled = max(1, len(groups)) * sum(info.num_computed_tokens for info in running)
    nulls = sum(t.count(state.null_block) for info in running for t in info.block_tables)
    filled -= (extra_refs + (nulls if state.null_block is not None else 0)) * state.block_size
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


def contiguous_figures(state: WholeState) -> ContiguousFigures:
    """What a contiguous `max_model_len` reservation per running request would hold."""
    max_len = state.engine.max_model_len if state.engine else 0
    running = [state.requests[r] for r in state.running if r in state.requests]
    filled = sum(min(r.num_computed_tokens, max_len) for r in running)
    capacity = state.num_blocks * state.block_size
    return ContiguousFigures(
        len(running), len(running) * max_len, filled, capacity // max_len if max_len else 0
    )


def rank_forward_times(state: WholeState) -> tuple[float, ...]:
    """Each tensor-parallel rank's forward time in the last step done, in rank order (seconds);
    () without tensor parallelism or before the first step. The reducer keeps the step's
    `StepSummary`, which carries them."""
    summary = state.last_step.summary if state.last_step else None
    if state.tensor_parallel_size < 2 or summary is None:
        return ()
    return summary.rank_forward_times


def primary_group(state: WholeState) -> int:
    """The KV cache group whose block table says where a request's tokens are: the first
    full-attention group, which keeps every block the request wrote (a sliding group's table
    reads the null block where its window passed); 0 with one group."""
    groups = state.engine.kv_cache_groups if state.engine is not None else ()
    return next((g for g, group in enumerate(groups) if group.sliding_window is None), 0)


def primary_table(state: WholeState, request: RequestInfo) -> tuple[int, ...]:
    """`request`'s block table in the `primary_group`."""
    tables = request.block_tables
    group = primary_group(state)
    return tables[group] if group < len(tables) else ()


def table_holders(state: WholeState) -> tuple[str, ...]:
    """Requests whose block tables the views list: the running ones in admission order, then
    the ones being admitted in this step (still in the waiting queue, but already holding the
    blocks the scheduler just gave them)."""
    admitting = tuple(
        r for r in state.waiting if r in state.requests and any(state.requests[r].block_tables)
    )
    return state.running + admitting


def block_fill(state: WholeState, request: RequestInfo, logical: int) -> int:
    """How many slots of `request`'s logical block `logical` hold a token's K and V."""
    used = request.num_computed_tokens - logical * state.block_size
    return max(0, min(used, state.block_size))


def last_block_fill(state: WholeState, request: RequestInfo) -> int:
    """How many of the slots of `request`'s last block hold a token's K and V."""
    table = primary_table(state, request)
    return block_fill(state, request, len(table) - 1) if table else 0


def family_of(state: WholeState, request_id: str) -> tuple[str, tuple[str, ...]] | None:
    """(parent id, every child's id) when `request_id` is a child of parallel sampling."""
    child = parse_child_id(request_id)
    if child is None:
        return None
    members = state.families.get(child[1], ())
    return (child[1], members) if request_id in members else None


def shown_step(state: WholeState) -> StepRecord | None:
    """The step the views describe: the one being played (mid-step), else the last one done."""
    return state.draft if state.draft.scheduled or state.draft.preempted else state.last_step


@dataclass(frozen=True)
class Changes:
    """What the latest move changed: the views flash these."""

    blocks: frozenset[int] = frozenset()
    requests: frozenset[str] = frozenset()


NO_CHANGES = Changes()


def latest_changes(state: WholeState) -> Changes:
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
            for slots in (event.slot_mapping, *event.group_slot_mappings):  # (every group's)
                blocks.update(slot // state.block_size for slot in slots)
    if not blocks and not requests:
        return NO_CHANGES
    return Changes(frozenset(blocks), frozenset(requests))
