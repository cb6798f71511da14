"""The story panel's state: a step told in words, made when a view asks, not by the reducer.

`narrative.narrate(state, event)` needs the state *before* each event (what a block held before
it was evicted, how long the waiting queue was before an arrival). Calling it inside
`state.reduce` would put its cost on every event, drawn or not; a step played as fast as it
goes is drawn a few times a second at most. So the reducer only hands each step one
`StepStory`, holding the state the step started from; every version of the step's record
(`steps.StepRecord`) shares it, and `StepRecord.notes` asks it for the notes up to the record's
events. It replays those events from the opening state with the reducer, narrating each one,
and remembers where it got to: drawing after every event costs one narrated event each, and
a view that goes back inside the step gets the notes it was told before.

The notes are the same whichever way the step is reduced (the replay is the same reducer), so
they are not part of the states' equality.

`state.py` makes the stories, so a story knows its states only as `WholeState`s
(`whole_state.py`, what `narrate` reads) and its reducer as the function it is handed.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import Lock
from typing import Generic, TypeVar

from nanovllm.events import Event
from nanovllm.viz.narrative import Note, add_note, narrate
from nanovllm.viz.whole_state import WholeState

State = TypeVar("State", bound=WholeState)


class StepStory(Generic[State]):
    """One step's notes, told from `opening` (the state before the step's first event)."""

    def __init__(self, opening: State, advance: Callable[[State, Event], State]):
        self._opening = opening
        self._advance = advance  # the reducer, without telling a story of its own
        self._lock = Lock()  # the engine worker and the UI may ask at once
        self._told: tuple[Event, ...] = ()  # the events narrated so far
        self._notes: list[tuple[Note, ...]] = [()]  # the notes after 0, 1, 2 ... of them
        self._state = opening  # the state after `_told`

    def notes(self, events: tuple[Event, ...]) -> tuple[Note, ...]:
        """The notes for the step's first `len(events)` events, `events`."""
        with self._lock:
            n = min(len(events), len(self._told))
            if self._told[:n] != events[:n]:  # another sequence from the same start
                self._told, self._notes, self._state = (), [()], self._opening
            if len(events) < len(self._notes):
                return self._notes[len(events)]
            notes, state = self._notes[-1], self._state
            for event in events[len(self._told) :]:
                notes = add_note(notes, narrate(state, event))
                state = self._advance(state, event)
                self._notes.append(notes)
            self._told, self._state = events, state
            return notes
