"""The reducer split by panel: an event touches only what it changes, and narration happens
when a view asks for a step's notes, never inside `reduce`.

The committed trace (a real engine's run: prefix hits, preemption, speculative decoding) is
folded event by event; after each event, every panel and every request or block entry the
event does not name must be the very object it was before (`is`). The notes are checked
against narration done the direct way: `narrate` on each real state before its event.
"""

from __future__ import annotations

import dataclasses

import pytest

from nanovllm.events import (
    BlockAllocated,
    BlockCached,
    BlockEvicted,
    BlockFreed,
    CacheHit,
    EngineStarted,
    KVBlockSaved,
    RequestAdded,
    StepSummary,
    TokenEmitted,
)
from nanovllm.viz import story
from nanovllm.viz.blocks import BlockInfo
from nanovllm.viz.executor import EXECUTOR_EVENTS
from nanovllm.viz.frozen import evolve
from nanovllm.viz.narrative import add_note, narrate
from nanovllm.viz.state import VizState, reduce, reduce_all
from nanovllm.viz.whole_state import WholeState

BLOCK_EVENTS = (BlockAllocated, CacheHit, BlockFreed, BlockCached, BlockEvicted)


def test_an_event_leaves_what_it_does_not_name_untouched(trace_events):
    kinds = {type(e) for e in trace_events}
    assert {BlockCached, BlockAllocated, BlockFreed, CacheHit, TokenEmitted} <= kinds
    before = reduce(VizState(), trace_events[0])
    for event in trace_events[1:]:
        after = reduce(before, event)
        if isinstance(event, BLOCK_EVENTS):
            assert after.tier is before.tier and after.executor is before.executor
            changed = event.block_id
            for b, (old, new) in enumerate(zip(before.blocks, after.blocks, strict=True)):
                assert new is old or b == changed, (event, b)
            if isinstance(event, (BlockCached, BlockEvicted)):
                assert after.queues is before.queues
        else:
            assert after.kv is before.kv, event
        if isinstance(event, EXECUTOR_EVENTS):
            assert after.queues is before.queues and after.tier is before.tier
        request_id = getattr(event, "request_id", None)
        if request_id is not None:
            for rid, info in after.requests.items():
                assert rid == request_id or info is before.requests[rid], (event, rid)
        if isinstance(event, TokenEmitted):
            assert after.tier is before.tier and after.executor is before.executor
        before = after


def test_a_tier_event_leaves_the_queues_and_blocks_untouched():
    started = EngineStarted(
        "m", 4, 4, 4, 16, 64, True, True, "torch", kv_connector="OffloadingConnector",
        num_tier_blocks=2,
    )  # fmt: skip
    state = reduce_all(VizState(), [started, RequestAdded("a", "abcd", 4, 1, ())])
    after = reduce(state, KVBlockSaved(1, 0, "1f2e3d", 1, "a"))
    assert after.tier is not state.tier and after.tier.slots == (None, "1f2e3d")
    assert after.queues is state.queues and after.kv is state.kv


def _told_directly(events) -> list[tuple]:
    """The notes after each event, by narrating every real state before its event."""
    told, state, notes = [], VizState(), ()
    for event in events:
        if isinstance(event, EngineStarted):
            notes = ()
        else:
            notes = add_note(notes, narrate(state, event))
        state = reduce(state, event)
        told.append(notes)
        if isinstance(event, StepSummary):
            notes = ()
    return told


def test_notes_are_told_outside_reduce_and_match_direct_narration(trace_events, monkeypatch):
    calls = []
    monkeypatch.setattr(story, "narrate", lambda s, e: calls.append(e) or narrate(s, e))
    told = _told_directly(trace_events)
    states, state = [], VizState()
    for event in trace_events:
        state = reduce(state, event)
        states.append(state)
    assert calls == []  # reducing told nothing
    last = states[-1].last_step
    assert last.notes == told[max(i for i, e in enumerate(trace_events) if e is last.summary)]
    assert calls == list(last.events)  # each of the step's events narrated once
    calls.clear()
    assert last.notes == last.notes and calls == []  # and remembered
    # Asked after some events and not others, the notes are the direct ones.
    for i in range(0, len(trace_events), 3):
        record = states[i].last_step if isinstance(trace_events[i], StepSummary) else None
        assert (record or states[i].draft).notes == told[i], i
    # Asked going back inside a step: the notes told before.
    for i in range(len(trace_events) - 1, 0, -7):
        if not isinstance(trace_events[i], StepSummary):
            assert states[i].draft.notes == told[i], i


def test_two_continuations_of_one_step_are_told_apart(trace_events):
    i = next(i for i, e in enumerate(trace_events) if isinstance(e, BlockAllocated))
    state = reduce_all(VizState(), trace_events[:i])
    block = trace_events[i].block_id
    one = reduce(state, trace_events[i])
    other = reduce(state, BlockCached(trace_events[i].request_id, block, "abc123"))
    for s in (one, other, one, other):
        expected = add_note(state.draft.notes, narrate(state, s.draft.events[-1]))
        assert s.draft.notes == expected


def test_evolve_is_replace_and_names_an_unknown_field():
    block = BlockInfo(ref_count=1, owners=("a",))
    assert evolve(block, ref_count=2) == dataclasses.replace(block, ref_count=2)
    assert evolve(block, ref_count=2).cached is False and block.ref_count == 1
    with pytest.raises(TypeError, match="refcount"):
        evolve(block, refcount=2)


def test_a_viz_state_has_every_field_a_whole_state_names():
    """The readers below `state.py` (figures, narration, why a request waits) are typed by
    `WholeState`; every field it names is one a `VizState` has."""
    names = [name for name in vars(WholeState) if not name.startswith("_")]
    assert "blocks" in names and "draft" in names
    state = VizState()
    missing = [name for name in names if not hasattr(state, name)]
    assert not missing, f"VizState lacks {missing}"
