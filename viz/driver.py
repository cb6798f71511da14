"""The engine worker: owns the engine (or a replayed trace), steps it, and reports states.

The UI must never wait for a forward pass, so the engine lives in a worker thread and the two
sides only talk through queues:

- UI -> worker: `Command`s (pause, step, speed, add a request, switch scenario, stop) on a
  thread-safe `queue.Queue`. The worker waits on that queue between steps, so a command takes
  effect at once even at one step per second, and a paused worker sleeps without polling.
- worker -> UI: after each step the worker folds the step's events into a new `VizState`
  (`state.reduce`) and hands it to `publish` together with a `DriverStatus`. The state is
  immutable, so it crosses threads without a lock and the UI may skip states it had no time to
  draw: every state carries its own history (the timeline), so nothing is lost by skipping.

`EngineDriver` runs a live engine on a scenario's workload; `ReplayDriver` plays a trace back
with the same controls. Neither imports Textual: they are tested, and could be reused, on
their own.
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

from nanovllm.events import Event
from nanovllm.viz.scenarios import DEFAULT_SCENARIO, SCENARIOS, Scenario, Workload
from nanovllm.viz.state import VizState, initial_state, reduce
from nanovllm.viz.trace import TraceWriter, frames, read_trace

logger = logging.getLogger("nanovllm.viz")

# Steps per second the speed keys step through; 0 means as fast as the engine goes.
SPEEDS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 0.0)
DEFAULT_SPEED = 4.0
FULL_SPEED_GAP = 0.002  # seconds between steps at full speed (see `Driver.run`)

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
    """Pause if running; otherwise run exactly one step."""


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
class Stop(Command):
    pass


# --- status (worker -> UI) ----------------------------------------------------------------------


@dataclass(frozen=True)
class DriverStatus:
    mode: str  # "live" or "replay"
    source: str  # the model's folder name, or the trace's file name
    scenario: str | None = None
    paused: bool = False
    speed: float = DEFAULT_SPEED
    loading: bool = True
    done: bool = False  # a replay reached its end
    frame: int = 0  # replay: frames played
    num_frames: int = 0
    steps: int = 0  # engine steps run by this driver (all scenarios together)
    error: str | None = None


Publish = Callable[[VizState, DriverStatus], None]
Notify = Callable[[str, str], None]  # (message, severity: "information" | "warning" | "error")


class Driver:
    """The command loop shared by the live and the replay driver."""

    mode = "live"

    def __init__(
        self,
        publish: Publish,
        notify: Notify | None = None,
        *,
        paused: bool = False,
        speed: float = DEFAULT_SPEED,
        max_steps: int | None = None,
    ) -> None:
        self.publish_fn = publish
        self.notify_fn = notify or (lambda message, severity: None)
        self.commands: queue.Queue[Command] = queue.Queue()
        self.state = VizState()
        self.status = DriverStatus(mode=self.mode, source="", paused=paused, speed=speed)
        self.max_steps = max_steps
        self._single_steps = 0

    # The UI's side.
    def send(self, command: Command) -> None:
        self.commands.put(command)

    def stop(self) -> None:
        self.commands.put(Stop())

    # The worker's side.
    def run(self) -> None:
        """Set up, then step until `Stop`. Runs in the worker thread; never raises."""
        try:
            self.setup()
        except Exception as exc:  # noqa: BLE001 - shown in the UI, not raised into Textual
            self._fail(exc)
            self._wait_for_stop()
            return
        self._set(loading=False)
        deadline = time.monotonic()
        while True:
            idle = self.status.paused and self._single_steps == 0
            try:
                if idle:
                    command = self.commands.get()
                else:
                    command = self.commands.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                command = None
            if isinstance(command, Stop):
                break
            if command is not None:
                self._handle_common(command)
                continue  # handle every waiting command before the next step
            if self.status.paused and self._single_steps == 0:
                continue
            self._single_steps = max(0, self._single_steps - 1)
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                self._set(paused=True)
            if self.max_steps is not None and self.state.step >= self.max_steps:
                self._set(paused=True)
            self.publish()
            speed = self.status.speed
            now = time.monotonic()
            # At full speed, still leave a breath between steps: the UI thread needs the GIL
            # to draw, and a worker that never lets go of it starves the frames.
            deadline = max(deadline + 1 / speed, now) if speed > 0 else now + FULL_SPEED_GAP
        self.close()

    def publish(self) -> None:
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
        if isinstance(command, TogglePause):
            self._set(paused=not self.status.paused)
        elif isinstance(command, SetPaused):
            self._set(paused=command.paused)
        elif isinstance(command, Step):
            if self.status.paused:
                self._single_steps += 1
            else:
                self._set(paused=True)
        elif isinstance(command, SetSpeed):
            self._set(speed=command.steps_per_s)
        else:
            self.handle(command)

    # For subclasses.
    def setup(self) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        raise NotImplementedError

    def handle(self, command: Command) -> None:
        self.notify_fn(f"{type(command).__name__} is not available here", "warning")

    def close(self) -> None:
        pass


class ReplayDriver(Driver):
    """Plays a recorded trace, one frame (engine step) per tick."""

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

    def tick(self) -> None:
        i = self.status.frame
        if i >= len(self._frames):
            self.status = replace(self.status, done=True, paused=True)
            return
        state = self.state
        for event in self._frames[i]:
            state = reduce(state, event)
        self.state = state
        done = i + 1 >= len(self._frames)
        self.status = replace(
            self.status, frame=i + 1, steps=self.status.steps + 1, done=done,
            paused=self.status.paused or done,
        )  # fmt: skip

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
        self.workload: Workload | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._tick = 0
        self._user_requests = 0
        self._arrivals = 0
        self.status = replace(self.status, scenario=scenario)

    def engine_options(self) -> dict[str, Any]:
        # Leave a core to the UI thread: on a small CPU, torch's threads would otherwise
        # compete with Textual for every core and both would crawl.
        threads = max(1, (os.cpu_count() or 2) - 1)
        return {"num_threads": threads, **self.scenario.engine, **self.overrides}

    def setup(self) -> None:
        # Imported here, in the worker: loading torch and the model takes seconds that the UI
        # spends drawing "loading" instead of freezing.
        from nanovllm.config import EngineConfig
        from nanovllm.engine.llm_engine import LLMEngine

        if self._unsubscribe is not None:
            self._unsubscribe()
        self.engine = LLMEngine(EngineConfig(**self.engine_options()))
        self.workload = self.scenario.workload(self.workload_seed)
        self._tick = 0
        self._arrivals = 0
        self.state = initial_state()
        self._unsubscribe = self.engine.subscribe(self._on_event)
        self.status = replace(
            self.status, source=self.engine.model_path.name, scenario=self.scenario.name
        )

    def _on_event(self, event: Event) -> None:
        self.state = reduce(self.state, event)
        if self.recorder is not None:
            self.recorder(event)

    def tick(self) -> None:
        from nanovllm.sampling_params import SamplingParams

        engine = self.engine
        assert self.workload is not None
        for arrival in self.workload.arrivals(self._tick, engine.has_unfinished_requests()):
            self._arrivals += 1
            params = SamplingParams(
                temperature=0.8,
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

    def handle(self, command: Command) -> None:
        from nanovllm.sampling_params import SamplingParams

        if isinstance(command, AddRequest):
            self._user_requests += 1
            request_id = f"you{self._user_requests}"
            try:
                params = SamplingParams(temperature=0.8, top_k=50, max_tokens=command.max_tokens)
                self.engine.add_request(request_id, command.prompt, params)
            except ValueError as exc:
                self.notify_fn(f"request rejected: {exc}", "error")
            else:
                self.notify_fn(f"added request {request_id}", "information")
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
            self.notify_fn(f"scenario: {self.scenario.title}", "information")

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.recorder is not None:
            self.recorder.close()
