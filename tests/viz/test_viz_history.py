"""The tape (`history.py`): sub-step playback and history over recorded steps.

Oracle: the reducer applied to the trace from its start. Wherever the cursor goes (one event,
one step, back, to the end, with recording interleaved and old steps forgotten), the state it
shows must equal the reduction of every event up to the cursor; and a state the tape hands out
twice must be the same object (history keeps states, it does not recompute them).
"""

from __future__ import annotations

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.events import StepSummary
from nanovllm.viz.history import Tape
from nanovllm.viz.state import VizState, reduce, reduce_all
from nanovllm.viz.trace import frames


@pytest.fixture(scope="module")
def prefix_states(trace_events) -> list[VizState]:
    """prefix_states[i]: the state after the trace's first i events."""
    states = [VizState()]
    for event in trace_events:
        states.append(reduce(states[-1], event))
    return states


def cursor_index(tape: Tape) -> int:
    """How many of the trace's events lie before the cursor (the first is `EngineStarted`)."""
    return 1 + tape.dropped_events + sum(len(s) for s in tape.steps[: tape.j]) + tape.k


moves = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.integers(1, 40)),
        st.tuples(st.sampled_from(["event", "step", "back", "end"]), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=examples(40), deadline=None)
@given(moves=moves, max_history=st.sampled_from([2, 5, 300]))
def test_cursor_state_is_the_reduction_up_to_the_cursor(
    trace_events, prefix_states, moves, max_history
):
    tape = Tape(max_history=max_history)
    fed = 0
    for move, n in moves:
        if move == "record":
            tape.record(trace_events[fed : fed + n])
            fed = min(len(trace_events), fed + n)
        elif move == "event":
            tape.forward_event()
        elif move == "step":
            tape.forward_step()
        elif move == "back":
            tape.back_step()
        else:
            tape.to_end()
        if fed:
            assert tape.state == prefix_states[cursor_index(tape)]
        assert len(tape.steps) <= max_history


def test_playing_a_step_event_by_event_ends_in_the_stored_state(trace_events):
    """Each step, played one event at a time, ends equal to reducing the whole step at once,
    and the tape then hands out the stored boundary state itself."""
    tape = Tape()
    tape.record(trace_events)
    checked = 0
    while tape.j < tape.num_steps:
        start, events = tape.state, tape.steps[tape.j]
        whole = reduce_all(start, events)
        for _ in events:
            assert tape.forward_event()
        assert tape.state == whole and tape.state is tape.bounds[tape.j]
        assert isinstance(events[-1], StepSummary)
        checked += 1
    assert checked == len(list(frames(trace_events))) and not tape.forward_event()


def test_back_and_forward_return_identical_states(trace_events):
    tape = Tape()
    tape.record(trace_events)
    visited = [tape.state]
    while tape.forward_step():
        visited.append(tape.state)
    for expected in reversed(visited[:-1]):
        assert tape.back_step() and tape.state is expected
    assert not tape.back_step()
    for expected in visited[1:]:
        assert tape.forward_step() and tape.state is expected
    # Mid-step, back returns to the step's start and forward completes it.
    tape.back_step()
    boundary = tape.state
    tape.forward_event()
    tape.forward_event()
    assert tape.mid_step and tape.back_step() and tape.state is boundary
    assert tape.forward_step() and tape.state is visited[-1]


def test_history_is_bounded(trace_events):
    tape = Tape(max_history=10)
    tape.record(trace_events)
    assert tape.num_steps == 10 and len(tape.bounds) == 11
    while tape.back_step():
        pass
    assert tape.state.step == tape.bounds[-1].step - 10
