"""The engine worker: owns the engine (or a replayed trace), steps it, and plays its events.

The UI must never wait for a forward pass, so the engine lives in a worker thread and the two
sides only talk through queues:

- UI -> worker: `Command`s (pause, step, one event, back, forward, speed, add a request, switch
  scenario, stop) on a thread-safe `queue.Queue`. The worker waits on that queue between
  moves, so a command takes effect at once even at one step per second, and a paused worker
  sleeps without polling.
- worker -> UI: the worker records every event on a `Tape` (`history.py`) and moves a cursor
  over it; after each move it hands the state at the cursor to `publish` together with a
  `DriverStatus`. States are immutable, so they cross threads without a lock and the UI may
  skip states it had no time to draw.

How a step is played. A pace of up to `ANIMATE_UP_TO` plays a step event by event, each event
on screen for the same time, `event_seconds(speed)` (the pace sets events per second, so a step
of 40 events takes ten times as long as a step of 4: every event stays long enough to read),
and the finished step stays for `STEP_HOLD_EVENTS` events' time. Faster paces are whole steps
per second. Paused, `Step` plays one
whole step, `StepEvent` one event, `Back` / `Forward` move over the recorded steps without
touching the engine: the engine only steps when the cursor needs a step nobody has recorded.

`EngineDriver` runs a live engine on a scenario's workload (two, for the `disagg` scenario:
`disagg.py`; the tape then holds both engines' tagged events); `ReplayDriver` plays a trace back
with the same controls (`connect.py` adds a third, for a running server). None imports
Textual: they are tested, and could be reused, on their own.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nanovllm.events import EngineStarted, Event
from nanovllm.viz.disagg import DisaggRun, DisaggTape
from nanovllm.viz.history import MAX_HISTORY, Tape
from nanovllm.viz.scenarios import DEFAULT_SCENARIO, SCENARIOS, Arrival, Scenario, Workload
from nanovllm.viz.state import VizState
from nanovllm.viz.trace import TraceWriter, frames, read_trace

logger = logging.getLogger("nanovllm.viz")

# The paces the speed keys step through; 0 means as fast as the engine goes. Up to
# `ANIMATE_UP_TO` a pace plays events, `EVENTS_PER_PACE` events per second per unit of pace;
# above, a pace is whole steps per second.
SPEEDS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 0.0)
DEFAULT_SPEED = 2.0
ANIMATE_UP_TO = 8.0
EVENTS_PER_PACE = 2.0  # the default pace, 2, shows 4 events a second
STEP_HOLD_EVENTS = 2  # a finished step stays on screen as long as this many events
FULL_SPEED_GAP = 0.002  # seconds between steps at full speed (see `Driver.run`)
IDLE_WAIT = 0.1  # seconds before asking a source with nothing new again


def animates(speed: float) -> bool:
    """Whether this pace plays a step event by event."""
    return 0 < speed <= ANIMATE_UP_TO


def event_seconds(speed: float) -> float:
    """How long one event stays on screen at an animated pace."""
    return 1 / (EVENTS_PER_PACE * speed)


def pace_label(speed: float) -> str:
    """The pace as the top line shows it: events/s, steps/s, or max speed."""
    if speed <= 0:
        return "max speed"
    if animates(speed):
        return f"{EVENTS_PER_PACE * speed:g} events/s"
    return f"{speed:g} steps/s"


# --- commands (UI -> worker) --------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    pass


@dataclass(frozen=True)
class TogglePause(Command):
    pass


@dataclass(frozen=True)
class SetPaused(Command):
    paused: bool


@dataclass(frozen=True)
class Step(Command):
    """Pause if playing; otherwise play to the end of the step (the next step, at a boundary)."""


@dataclass(frozen=True)
class StepEvent(Command):
    """Pause, then apply exactly one more event."""


@dataclass(frozen=True)
class Back(Command):
    """Pause, then go back to the previous step boundary (in the recorded history)."""


@dataclass(frozen=True)
class Forward(Command):
    """Pause, then jump to the next step boundary at once (the engine steps if it must)."""


@dataclass(frozen=True)
class ToLatest(Command):
    """Pause, then jump to the newest recorded state."""


@dataclass(frozen=True)
class SetSpeed(Command):
    steps_per_s: float  # 0: as fast as possible


@dataclass(frozen=True)
class AddRequest(Command):
    prompt: str
    max_tokens: int = 48


@dataclass(frozen=True)
class SwitchScenario(Command):
    name: str


@dataclass(frozen=True)
class ProbeAttention(Command):
    """Have the engine tell what layer `layer`'s attention computes for `request_id` from its
    next step on (None: stop); the executor panel asks while it is open. Only a live engine has
    the probe: elsewhere this does nothing (the panel says why it has no numbers)."""

    request_id: str | None
    layer: int = 0


@dataclass(frozen=True)
class Stop(Command):
    pass


# --- status (worker -> UI) ----------------------------------------------------------------------


@dataclass(frozen=True)
class DriverStatus:
    mode: str  # "live", "replay" or "connect"
    source: str  # the model's folder name, the trace's file name, the server's URL
    scenario: str | None = None
    paused: bool = False
    speed: float = DEFAULT_SPEED
    loading: bool = True
    done: bool = False  # a replay reached its end
    frame: int = 0  # replay: frames (steps) read from the trace
    num_frames: int = 0
    steps: int = 0  # engine steps run by this driver (all scenarios together)
    error: str | None = None
    event: int = 0  # events of the step in progress applied at the cursor (0: at a boundary)
    num_step_events: int = 0  # events recorded for that step
    behind: int = 0  # recorded steps ahead of the cursor (history)
    history: int = 0  # steps recorded and kept


Publish = Callable[[VizState, DriverStatus], None]
Notify = Callable[[str, str], None]  # (message, severity: "information" | "warning" | "error")


class Driver:
    """The command loop and the tape, shared by every source of events.

    A subclass says where events come from: `setup()` once, then `pull()` whenever the cursor
    needs more than is recorded (it records what it got on `self.tape`, and says whether there
    was anything).
    """

    mode = "live"

    def __init__(
        self,
        publish: Publish,
        notify: Notify | None = None,
        *,
        paused: bool = False,
        speed: float = DEFAULT_SPEED,
        max_steps: int | None = None,
        max_history: int = MAX_HISTORY,
    ) -> None:
        self.publish_fn = publish
        self.notify_fn = notify or (lambda message, severity: None)
        self.commands: queue.Queue[Command] = queue.Queue()
        self.tape = Tape(max_history=max_history)
        self.status = DriverStatus(mode=self.mode, source="", paused=paused, speed=speed)
        self.max_steps = max_steps
        self.exhausted = False  # the source has nothing more, ever (end of a trace)
        self._to_boundary = False  # paused, but playing on to the end of a step (`Step`)

    @property
    def state(self) -> VizState:
        """The state at the cursor: what the views draw."""
        return self.tape.state

    # The UI's side.
    def send(self, command: Command) -> None:
        self.commands.put(command)

    def stop(self) -> None:
        self.commands.put(Stop())

    # The worker's side.
    def run(self) -> None:
        """Set up, then play until `Stop`. Runs in the worker thread; never raises."""
        try:
            self.setup()
        except Exception as exc:  # noqa: BLE001 - shown in the UI, not raised into Textual
            self._fail(exc)
            self._wait_for_stop()
            return
        self._set(loading=False)
        deadline = time.monotonic()
        while True:
            busy = not self.status.paused or self._to_boundary
            try:
                if busy:
                    command = self.commands.get(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    command = self.commands.get()
            except queue.Empty:
                command = None
            if isinstance(command, Stop):
                break
            if command is not None:
                try:
                    self._handle_common(command)
                except Exception as exc:  # noqa: BLE001
                    self._fail(exc)
                deadline = time.monotonic()
                continue  # handle every waiting command before the next move
            if not busy:
                continue
            try:
                delay = self._play()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                self._to_boundary = False
                self.status = replace(self.status, paused=True)
                delay = 0.0
            self.publish()
            deadline = time.monotonic() + delay
        self.close()

    def _play(self) -> float:
        """One move of the cursor while playing; returns the seconds until the next one."""
        speed = self.status.speed
        tape = self.tape
        if animates(speed):
            moved = tape.forward_event() or self._pull_and(tape.forward_event)
            at_boundary = tape.k == 0
            delay = event_seconds(speed) * (STEP_HOLD_EVENTS if at_boundary else 1)
        else:
            moved = self._forward_step()
            at_boundary = tape.k == 0
            delay = 1 / speed if speed > 0 else FULL_SPEED_GAP
        if at_boundary:
            self._to_boundary = False
        self._check_limits()
        if not moved:
            return IDLE_WAIT
        return delay

    def _pull_and(self, move: Callable[[], bool]) -> bool:
        if self.exhausted:
            return False
        return self.pull() and move()

    def _forward_step(self) -> bool:
        """To the next step boundary, stepping the source when the tape has no step ahead.

        The test is where the cursor stands, not how many steps the tape holds: once the tape
        is full, recording a step forgets the oldest one, so that count no longer changes.
        """
        tape = self.tape
        while not tape.step_ahead and self._pull_and(lambda: True):
            pass
        return tape.forward_step()

    def _check_limits(self) -> None:
        tape = self.tape
        if self.max_steps is not None and self.state.step >= self.max_steps and tape.k == 0:
            self.status = replace(self.status, paused=True)
            self._to_boundary = False
        if self.exhausted and tape.at_end:
            self.status = replace(self.status, done=True, paused=True)
            self._to_boundary = False

    def publish(self) -> None:
        tape = self.tape
        self.status = replace(
            self.status,
            event=tape.k,
            num_step_events=len(tape.step_events()) if tape.k else 0,
            behind=tape.steps_behind,
            history=tape.num_steps,
        )
        self.publish_fn(self.state, self.status)

    def _set(self, **changes: Any) -> None:
        self.status = replace(self.status, **changes)
        self.publish()

    def _fail(self, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"
        logger.debug("engine worker failed", exc_info=exc)  # the UI shows the message
        self.status = replace(self.status, error=message, loading=False)
        self.notify_fn(message, "error")
        self.publish()

    def _wait_for_stop(self) -> None:
        while not isinstance(self.commands.get(), Stop):
            pass

    def _handle_common(self, command: Command) -> None:
        tape = self.tape
        if isinstance(command, TogglePause):
            self._to_boundary = False
            self._set(paused=not self.status.paused, done=False)
        elif isinstance(command, SetPaused):
            self._to_boundary = False
            self._set(paused=command.paused)
        elif isinstance(command, Step):
            if not self.status.paused:
                self._set(paused=True)
            elif self._to_boundary or not animates(self.status.speed):
                # Already playing a step (or no animation at this speed): finish it at once.
                self._to_boundary = False
                self._forward_step()
                self._check_limits()
                self.publish()
            else:
                self._to_boundary = True  # `run` plays the step's events, then stops
        elif isinstance(command, StepEvent):
            self._to_boundary = False
            self.status = replace(self.status, paused=True)
            tape.forward_event() or self._pull_and(tape.forward_event)
            self._check_limits()
            self.publish()
        elif isinstance(command, Back):
            self._to_boundary = False
            self.status = replace(self.status, paused=True, done=False)
            tape.back_step()
            self.publish()
        elif isinstance(command, Forward):
            self._to_boundary = False
            self.status = replace(self.status, paused=True)
            self._forward_step()
            self._check_limits()
            self.publish()
        elif isinstance(command, ToLatest):
            self._to_boundary = False
            self.status = replace(self.status, paused=True)
            tape.to_end()
            self._check_limits()
            self.publish()
        elif isinstance(command, SetSpeed):
            self._set(speed=command.steps_per_s)
        elif isinstance(command, ProbeAttention):
            self.probe(command)
        else:
            self.handle(command)

    # For subclasses.
    def setup(self) -> None:
        raise NotImplementedError

    def pull(self) -> bool:
        """Record more events on the tape; False when there was nothing (yet)."""
        raise NotImplementedError

    def handle(self, command: Command) -> None:
        self.notify_fn(f"{type(command).__name__} is not available here", "warning")

    def probe(self, command: ProbeAttention) -> None:
        """Only a live engine has an attention probe (a trace holds what was probed)."""

    def close(self) -> None:
        pass


class ReplayDriver(Driver):
    """Plays a recorded trace: `pull` records its next frame (one engine step)."""

    mode = "replay"

    def __init__(self, trace: str | Path | list[Event], publish: Publish, **kwargs: Any) -> None:
        super().__init__(publish, **kwargs)
        self.trace = trace
        self._frames: list[list[Event]] = []
        name = Path(trace).name if isinstance(trace, str | Path) else "events"
        self.status = replace(self.status, source=name)

    def setup(self) -> None:
        events = read_trace(self.trace) if isinstance(self.trace, str | Path) else self.trace
        self._frames = list(frames(events))
        self.status = replace(self.status, num_frames=len(self._frames))
        if self._frames and isinstance(self._frames[0][0], EngineStarted):
            self.tape.record(self._frames[0][:1])  # the engine's shape, before any step
            self._frames[0] = self._frames[0][1:]
        self.exhausted = not any(self._frames)

    def pull(self) -> bool:
        i = self.status.frame
        if i >= len(self._frames):
            self.exhausted = True
            return False
        self.tape.record(self._frames[i])
        self.exhausted = i + 1 >= len(self._frames)
        self.status = replace(self.status, frame=i + 1, steps=self.status.steps + 1)
        return True

    def handle(self, command: Command) -> None:
        what = "add a request" if isinstance(command, AddRequest) else "switch scenario"
        self.notify_fn(f"cannot {what} while replaying a trace (there is no model)", "warning")


class EngineDriver(Driver):
    """Runs a live engine on a scenario's workload.

    `overrides` are engine options the user chose on the command line; they win over the
    scenario's. `record` appends every event to a JSON-lines trace.
    """

    def __init__(
        self,
        publish: Publish,
        *,
        scenario: str = DEFAULT_SCENARIO,
        overrides: dict[str, Any] | None = None,
        record: str | Path | None = None,
        workload_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(publish, **kwargs)
        self.overrides = dict(overrides or {})
        self.scenario: Scenario = SCENARIOS[scenario]
        self.workload_seed = workload_seed
        self.recorder = TraceWriter(record) if record else None
        self.engine: Any = None
        self.disagg: DisaggRun | None = None  # the two engines of a `two_engines` scenario
        self.workload: Workload | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._tick = 0
        self._pending: list[Event] = []
        self._user_requests = 0
        self._arrivals = 0
        self._probe = ProbeAttention(None)  # what the executor panel asked for last
        self.status = replace(self.status, scenario=scenario)

    def engine_options(self) -> dict[str, Any]:
        # Leave a core to the UI thread: on a small CPU, torch's threads would otherwise
        # compete with Textual for every core and both would crawl.
        threads = max(1, (os.cpu_count() or 2) - 1)
        options = {"num_threads": threads, **self.scenario.engine, **self.overrides}
        if self.scenario.model is not None and options.get("model") is None:
            options["model"] = str(self.scenario.model())
        return options

    def setup(self) -> None:
        # Imported here, in the worker: loading torch and the model takes seconds that the UI
        # spends drawing "loading" instead of freezing.
        from nanovllm import EngineConfig, LLMEngine

        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.engine is not None:
            # Its tensor-parallel workers, if any, stop first: a process leads one group at a time.
            self.engine.shutdown()
            self.engine = None
        if self.disagg is not None:
            self.disagg.close()  # its link's port too
            self.disagg = None
        if self.scenario.two_engines:
            self._setup_disagg()
            return
        if isinstance(self.tape, DisaggTape):
            self.tape = Tape(max_history=self.tape.max_history)
        self.engine = LLMEngine(EngineConfig(**self.engine_options()))
        self.workload = self.scenario.workload(self.workload_seed)
        self._tick = 0
        self._arrivals = 0
        self._unsubscribe = self.engine.subscribe(self._on_event)
        self._record_pending()  # `EngineStarted`: a new tape
        self.probe(self._probe)  # (a new engine: the panel's probe again)
        self.status = replace(
            self.status, source=self.engine.model_path.name, scenario=self.scenario.name
        )

    def _setup_disagg(self) -> None:
        self.workload = self.scenario.workload(self.workload_seed)
        self.disagg = DisaggRun(self.engine_options(), self.workload)
        self.tape = DisaggTape(max_history=self.tape.max_history)
        self.tape.record(self.disagg.take_events())  # both engines' `EngineStarted`
        self.status = replace(
            self.status, source=self.disagg.model_name, scenario=self.scenario.name
        )

    def _on_event(self, event: Event) -> None:
        self._pending.append(event)
        if self.recorder is not None:
            self.recorder(event)

    def _record_pending(self) -> bool:
        events, self._pending = self._pending, []
        self.tape.record(events)
        return bool(events)

    def pull(self) -> bool:
        """One tick of the workload: its arrivals, then one engine step (when there is work)."""
        from nanovllm import SamplingParams

        if self.disagg is not None:  # (a trace holds one engine's events: not recorded)
            state = self.tape.open_state
            events, steps = self.disagg.pull(len(state.prefill.waiting) + len(state.decode.waiting))
            self.tape.record(events)
            self.status = replace(self.status, steps=self.status.steps + steps)
            return bool(events)
        engine = self.engine
        assert self.workload is not None
        busy = engine.has_unfinished_requests()
        waiting = len(self.tape.open_state.waiting)  # from the events, like every view
        for arrival in self.workload.arrivals(self._tick, busy, waiting):
            self._arrivals += 1
            params = SamplingParams(
                n=arrival.n,
                temperature=arrival.temperature,
                top_k=50,
                max_tokens=arrival.max_tokens,
                seed=arrival.seed,
                ignore_eos=True,  # lengths as the scenario planned them
            )
            try:
                engine.add_request(f"r{self._arrivals}", arrival.prompt, params)
            except ValueError:
                pass  # a RequestRejected event tells the UI
        self._tick += 1
        if engine.has_unfinished_requests():
            engine.step()
            self.status = replace(self.status, steps=self.status.steps + 1)
        if self.recorder is not None:
            self.recorder.flush()
        return self._record_pending()

    def probe(self, command: ProbeAttention) -> None:
        self._probe = command
        if self.engine is None:  # (two engines, `disagg`: no executor panel)
            return
        try:
            self.engine.probe_attention(command.request_id, command.layer)
        except ValueError as exc:  # (a model with fewer layers, say)
            self.notify_fn(f"no attention probe: {exc}", "warning")

    def handle(self, command: Command) -> None:
        from nanovllm import SamplingParams

        if isinstance(command, AddRequest):
            self._user_requests += 1
            request_id = f"you{self._user_requests}"
            try:
                if self.disagg is not None:
                    seed = self._user_requests
                    arrival = Arrival(command.prompt, command.max_tokens, seed)
                    self.disagg.add(request_id, arrival)
                else:
                    params = SamplingParams(
                        temperature=0.8, top_k=50, max_tokens=command.max_tokens
                    )
                    self.engine.add_request(request_id, command.prompt, params)
            except ValueError as exc:
                self.notify_fn(f"request rejected: {exc}", "error")
            else:
                self.notify_fn(f"added request {request_id}", "information")
            # Show the arrival at once: from the newest state, over the events it made.
            self.tape.to_end()
            if self.disagg is not None:
                self.tape.record(self.disagg.take_events())
            else:
                self._record_pending()
            while self.tape.forward_event():
                pass
            self.publish()
        elif isinstance(command, SwitchScenario):
            if command.name not in SCENARIOS:
                self.notify_fn(f"unknown scenario {command.name!r}", "error")
                return
            self.scenario = SCENARIOS[command.name]
            self._set(loading=True, scenario=command.name)
            try:
                self.setup()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                return
            self._set(loading=False)
            # What to watch, as the help screen has it: said as the scenario starts.
            self.notify_fn(f"{self.scenario.title}: {self.scenario.what_to_watch}", "information")

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.engine is not None:
            self.engine.shutdown()  # stops the tensor-parallel workers, if any
        if self.disagg is not None:
            self.disagg.close()
        if self.recorder is not None:
            self.recorder.close()
