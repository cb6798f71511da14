"""The engine worker (`driver.py`), the workloads and the trace format, without Textual."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import pytest

from nanovllm.events import EngineStarted, RequestAdded, StepSummary
from nanovllm.viz.driver import (
    AddRequest,
    DriverStatus,
    EngineDriver,
    ReplayDriver,
    SetSpeed,
    Step,
    SwitchScenario,
    TogglePause,
)
from nanovllm.viz.scenarios import SCENARIOS, Workload
from nanovllm.viz.state import VizState, reduce_all
from nanovllm.viz.trace import frames, read_trace, write_trace


class Collector:
    """Receives what a driver publishes (in its thread); lets the test wait for a condition."""

    def __init__(self) -> None:
        self.state = VizState()
        self.status: DriverStatus | None = None
        self.notices: list[tuple[str, str]] = []
        self.published = 0
        self._cond = threading.Condition()

    def publish(self, state: VizState, status: DriverStatus) -> None:
        with self._cond:
            self.state, self.status = state, status
            self.published += 1
            self._cond.notify_all()

    def notify(self, text: str, severity: str) -> None:
        with self._cond:
            self.notices.append((text, severity))
            self._cond.notify_all()

    def wait(self, predicate, timeout: float = 60.0) -> None:
        with self._cond:
            assert self._cond.wait_for(predicate, timeout), (self.status, self.notices)


def start(driver) -> threading.Thread:
    thread = threading.Thread(target=driver.run, daemon=True)
    thread.start()
    return thread


def test_frames_end_with_step_summaries(trace_events):
    split = list(frames(trace_events))
    assert isinstance(split[0][0], EngineStarted)
    assert all(isinstance(f[-1], StepSummary) for f in split)
    assert sum(len(f) for f in split) == len(trace_events)


def test_trace_round_trip(tmp_path: Path, trace_events):
    path = tmp_path / "t.jsonl"
    write_trace(path, trace_events)
    assert read_trace(path) == trace_events


def test_bad_trace_line_is_named(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kind": "engine_started"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_trace(path)


def test_replay_driver_pause_step_speed(trace_path: Path, trace_events):
    c = Collector()
    driver = ReplayDriver(trace_path, c.publish, notify=c.notify, paused=True, speed=16)
    thread = start(driver)
    c.wait(lambda: c.status is not None and not c.status.loading)
    assert c.state.step == 0 and c.status.paused
    for n in (1, 2, 3):
        driver.send(Step())
        c.wait(lambda n=n: c.state.step == n)
    driver.send(SetSpeed(0))
    c.wait(lambda: c.status.speed == 0)
    driver.send(TogglePause())  # run to the end at full speed
    c.wait(lambda: c.status.done)
    assert c.status.paused and c.status.frame == c.status.num_frames
    assert c.state == reduce_all(VizState(), trace_events)
    driver.send(AddRequest("hello"))  # no model in a replay: a warning, not a crash
    c.wait(lambda: c.notices)
    assert "cannot add a request" in c.notices[0][0]
    driver.stop()
    thread.join(5)
    assert not thread.is_alive()


def test_replay_driver_stops_at_max_steps(trace_path: Path):
    c = Collector()
    driver = ReplayDriver(trace_path, c.publish, speed=0, max_steps=7)
    thread = start(driver)
    c.wait(lambda: c.status is not None and c.status.paused and not c.status.loading)
    assert c.state.step == 7
    driver.send(Step())  # paused: exactly one more
    c.wait(lambda: c.state.step == 8)
    driver.stop()
    thread.join(5)


def test_missing_trace_is_reported(tmp_path: Path):
    c = Collector()
    driver = ReplayDriver(tmp_path / "nope.jsonl", c.publish, notify=c.notify)
    thread = start(driver)
    c.wait(lambda: c.status is not None and c.status.error is not None)
    assert "nope.jsonl" in c.status.error
    driver.stop()
    thread.join(5)


def test_engine_driver_records_adds_and_switches(tiny_llama: Path, tmp_path: Path):
    trace = tmp_path / "live.jsonl"
    c = Collector()
    driver = EngineDriver(
        c.publish,
        notify=c.notify,
        scenario="prefix",
        overrides=dict(model=str(tiny_llama), num_threads=1),
        record=trace,
        speed=0,
        max_steps=4,
    )
    thread = start(driver)
    c.wait(lambda: c.status is not None and c.status.paused and c.state.step == 4)
    assert c.state.engine.num_kv_blocks == SCENARIOS["prefix"].engine["num_kv_blocks"]
    assert c.state.requests  # the workload sent requests
    driver.send(AddRequest("ROMEO:", max_tokens=3))
    c.wait(lambda: "you1" in c.state.requests)
    driver.send(Step())
    c.wait(lambda: c.state.step == 5)
    live_state = c.state
    driver.send(SwitchScenario("burst"))
    c.wait(lambda: c.status.scenario == "burst" and not c.status.loading)
    assert c.state.engine.num_kv_blocks == SCENARIOS["burst"].engine["num_kv_blocks"]
    assert c.state.step == 0
    driver.send(SwitchScenario("nope"))
    c.wait(lambda: any("unknown scenario" in text for text, _ in c.notices))
    driver.stop()
    thread.join(10)
    assert not thread.is_alive()
    # The recording replays into the very state the driver had before the switch.
    events = read_trace(trace)
    starts = [i for i, e in enumerate(events) if isinstance(e, EngineStarted)]
    assert len(starts) == 2
    assert reduce_all(VizState(), events[: starts[1]]) == live_state
    assert any(isinstance(e, RequestAdded) and e.request_id == "you1" for e in events)


def test_speculative_and_parallel_scenarios_reach_the_engine(tiny_llama: Path):
    """The speculative scenario's engine speculates and its requests are greedy; the parallel
    scenario's requests have n > 1, and the visualizer sees their children as families."""
    c = Collector()
    driver = EngineDriver(
        c.publish,
        notify=c.notify,
        scenario="speculative",
        overrides=dict(model=str(tiny_llama), num_threads=1),
        speed=0,
        max_steps=2,
    )
    thread = start(driver)
    c.wait(lambda: c.status is not None and c.status.paused and c.state.step == 2)
    # From the engine's own events (the viz sees nothing else): it speculates 4 tokens.
    engine = c.state.engine
    assert (engine.speculative_method, engine.num_speculative_tokens) == ("ngram", 4)
    assert all(a.temperature == 0 for a in SCENARIOS["speculative"].workload(0).arrivals(0, False))
    driver.max_steps = 4
    driver.send(SwitchScenario("parallel"))
    c.wait(lambda: c.status.scenario == "parallel" and not c.status.loading)
    driver.send(Step())
    c.wait(lambda: c.state.step == 1)
    # The first tick's arrivals, r1, r2 ..., each with n children `0_r1`, `1_r1` ...
    arrivals = SCENARIOS["parallel"].workload(0).arrivals(0, False)
    assert c.state.families == {
        f"r{i}": tuple(f"{j}_r{i}" for j in range(a.n)) for i, a in enumerate(arrivals, 1)
    }
    driver.stop()
    thread.join(10)


def test_engine_driver_reports_a_bad_config(tiny_llama: Path):
    c = Collector()
    driver = EngineDriver(
        c.publish, notify=c.notify, overrides=dict(model=str(tiny_llama), num_kv_blocks=0)
    )
    thread = start(driver)
    c.wait(lambda: c.status is not None and c.status.error is not None)
    assert "num_kv_blocks" in c.status.error
    driver.stop()
    thread.join(5)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_workloads_are_deterministic_and_send_requests(name: str):
    def run() -> list:
        workload = SCENARIOS[name].workload(seed=3)
        return [workload.arrivals(tick, busy=tick < 30) for tick in range(60)]

    first = run()
    assert first == run()
    assert first[0], "every scenario starts with requests"
    assert sum(len(a) for a in first) >= 2


def test_burst_comes_back_after_idle():
    workload = Workload("burst")
    assert len(workload.arrivals(0, busy=False)) == 12
    assert workload.arrivals(1, busy=True) == []
    got = [len(workload.arrivals(t, busy=False)) for t in range(2, 8)]
    assert 12 in got


def test_cli_engine_overrides_keep_scenario_defaults():
    from nanovllm.viz import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    defaults = {"dtype": "auto", "seed": 0, "tensor_parallel_size": 1, "enforce_eager": True}
    defaults["async_scheduling"] = False
    assert cli.engine_overrides(parser.parse_args([])) == defaults
    args = parser.parse_args(["--num-kv-blocks", "12", "--no-prefix-caching", "--model", "m"])
    overrides = cli.engine_overrides(args)
    assert overrides["num_kv_blocks"] == 12 and overrides["enable_prefix_caching"] is False
    assert overrides["model"] == "m" and "block_size" not in overrides


def test_speed_controls_pace(trace_path: Path):
    """At 20 steps/s, 5 steps take about a quarter of a second, not zero."""
    c = Collector()
    driver = ReplayDriver(trace_path, c.publish, speed=20.0)
    thread = start(driver)
    c.wait(lambda: c.status is not None and not c.status.loading)
    t0, s0 = time.monotonic(), c.state.step
    c.wait(lambda: c.state.step >= s0 + 5)
    assert time.monotonic() - t0 >= 0.15
    driver.stop()
    thread.join(5)
