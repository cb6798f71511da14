"""`Tape`: the recorded steps and the cursor a learner moves over them, event by event.

The engine (or a trace, or a server) produces events; the tape cuts them into steps (each
closed by its `StepSummary`) and keeps, for the last `MAX_HISTORY` steps, the events and the
state at every step boundary. What the views draw is the state at the *cursor*:

    bounds[0]   step 1's events   bounds[1]   step 2's events   bounds[2] ...   open events
       |---e---e---e---e---S---|---e---e---S---|--- ... ---|---e---e (no summary yet)
                    ^ cursor (j=0, k=3): bounds[0] with step 1's first 3 events applied

- `forward_event` applies one more event: a step plays as sub-steps in engine order.
- `forward_step` jumps to the end of the step (the stored boundary state, nothing recomputed).
- `back_step` returns to the previous boundary: the very state object drawn before, because
  states are immutable and the tape keeps them.

Playing a step event by event ends in a state equal to the stored boundary (the reducer is
pure); the tape then hands out the stored object itself, so views that compare by identity see
no change. The tape only records and moves; pacing and commands are the driver's.
"""

from __future__ import annotations

from collections.abc import Iterable

from nanovllm.events import EngineStarted, Event, StepSummary
from nanovllm.viz.state import VizState, reduce

MAX_HISTORY = 300  # steps kept behind the newest one


class Tape:
    def __init__(self, state: VizState | None = None, max_history: int = MAX_HISTORY) -> None:
        self.max_history = max_history
        self.bounds: list[VizState] = [state or VizState()]  # state after 0, 1, 2 ... steps
        self.steps: list[tuple[Event, ...]] = []  # closed steps: steps[j] leads to bounds[j + 1]
        self.open: list[Event] = []  # events after the last summary (a step in progress)
        self.open_state = self.bounds[0]  # bounds[-1] with the open events applied
        self.j = 0  # cursor: the boundary it starts from ...
        self.k = 0  # ... and how many events of the next step are applied
        self.state = self.bounds[0]  # the state at the cursor
        self.dropped = 0  # steps forgotten off the front
        self.dropped_events = 0  # ... and their events

    # --- recording --------------------------------------------------------------------------

    def record(self, events: Iterable[Event]) -> None:
        """Append events from the source; the cursor stays where it is.

        An `EngineStarted` starts a new tape: a new engine has nothing to go back to.
        """
        for event in events:
            if self.starts(event):
                self.reset(self.reduce(VizState(), event))
                continue
            self.open.append(event)
            self.open_state = self.reduce(self.open_state, event)
            if self.closes(event):
                self._close_step()

    def _close_step(self) -> None:
        self.steps.append(tuple(self.open))
        self.bounds.append(self.open_state)
        self.open = []
        while len(self.steps) > self.max_history:  # forget the oldest step
            self.dropped_events += len(self.steps.pop(0))
            self.bounds.pop(0)
            self.dropped += 1
            if self.j == 0:  # the cursor was in it: to the oldest boundary kept
                self.k = 0
                self.state = self.bounds[0]
            else:
                self.j -= 1

    def reset(self, state: VizState) -> None:
        self.__init__(state, self.max_history)  # type: ignore[misc]

    # What the tape records: a subclass may record other events into another state
    # (`disagg.DisaggTape`: two engines' tagged events).
    @staticmethod
    def reduce(state, event):
        return reduce(state, event)

    @staticmethod
    def starts(event) -> bool:
        """Whether `event` starts a new tape."""
        return isinstance(event, EngineStarted)

    @staticmethod
    def closes(event) -> bool:
        """Whether `event` ends a step."""
        return isinstance(event, StepSummary)

    # --- where the cursor is -----------------------------------------------------------------

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def step_events(self) -> tuple[Event, ...]:
        """The events of the step the cursor is in (or about to enter)."""
        return self.steps[self.j] if self.j < len(self.steps) else tuple(self.open)

    @property
    def at_end(self) -> bool:
        """Nothing recorded lies ahead of the cursor."""
        return self.j == len(self.steps) and self.k == len(self.open)

    @property
    def steps_behind(self) -> int:
        """Whole recorded steps ahead of the cursor (0 when it is in the newest one)."""
        return len(self.steps) - self.j - (1 if self.k else 0) if self.j < len(self.steps) else 0

    @property
    def step_ahead(self) -> bool:
        """A closed step lies ahead of the cursor: `forward_step` needs nothing new."""
        return self.j < len(self.steps)

    @property
    def mid_step(self) -> bool:
        return self.k > 0

    # --- moving ------------------------------------------------------------------------------

    def forward_event(self) -> bool:
        """Apply one more recorded event. False at the end of the tape."""
        events = self.step_events()
        if self.k >= len(events):
            return False
        self.k += 1
        if self.j < len(self.steps) and self.k == len(events):
            self.j, self.k = self.j + 1, 0
            self.state = self.bounds[self.j]  # equal to the replayed state; the stored object
        elif self.j == len(self.steps) and self.k == len(self.open):
            self.state = self.open_state
        else:
            self.state = self.reduce(self.state, events[self.k - 1])
        return True

    def forward_step(self) -> bool:
        """To the end of the step in progress (or of the next one). False at the end."""
        if self.j < len(self.steps):
            self.j, self.k = self.j + 1, 0
            self.state = self.bounds[self.j]
            return True
        if self.k < len(self.open):  # the open step: as far as it is recorded
            self.k = len(self.open)
            self.state = self.open_state
            return True
        return False

    def back_step(self) -> bool:
        """To the previous step boundary (the start of the step in progress). False at the start."""
        if self.k > 0:
            self.k = 0
        elif self.j > 0:
            self.j -= 1
        else:
            return False
        self.state = self.bounds[self.j]
        return True

    def to_last_boundary(self) -> None:
        """To the end of the newest closed step (a step still arriving stays ahead)."""
        if self.j < len(self.steps):
            self.j, self.k = len(self.steps), 0
            self.state = self.bounds[self.j]

    def to_end(self) -> None:
        self.j, self.k = len(self.steps), len(self.open)
        self.state = self.open_state
