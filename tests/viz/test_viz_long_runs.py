"""Runs longer than the history (defect 1 of issue 31) and the pace of play (defect 4).

Longer than the history: the tape keeps the last `MAX_HISTORY` steps, so once it is full the
number of recorded steps stops changing. Whatever moves the cursor past the newest step (play
at the highest speed, `→`, `s`, a headless screenshot) must still get there, and keys must
still be answered. A replay used to hide the bug (its source runs dry, which ended the wait);
a live engine never runs dry, so the tests use a source that does not either (`Endless`) and
the tiny model. Oracle: the step the source is at, and that the app reacts.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from test_viz_driver import Collector, start
from viz_helpers import engine_started, step_events, wait_until

from nanovllm.viz.app import VizApp, screen_text
from nanovllm.viz.driver import (
    DEFAULT_SPEED,
    SPEEDS,
    Driver,
    EngineDriver,
    Forward,
    ReplayDriver,
    Step,
    animates,
    event_seconds,
)
from nanovllm.viz.history import MAX_HISTORY

READABLE_S = 0.2  # an event on screen for less than this is a flicker, not a move to follow


class Endless(Driver):
    """A source that always has one more step, as a live engine does."""

    def setup(self) -> None:
        self.tape.record([engine_started()])
        self.made = 0

    def pull(self) -> bool:
        self.made += 1
        self.tape.record(step_events(self.made))
        self.status = replace(self.status, steps=self.status.steps + 1)
        return True


def test_full_speed_plays_past_the_history_of_a_source_that_never_ends():
    c = Collector()
    driver = Endless(c.publish, speed=0)
    thread = start(driver)
    c.wait(lambda: c.state.step >= MAX_HISTORY + 20, timeout=60)
    assert c.status.history == MAX_HISTORY
    driver.stop()  # and the worker still answers
    thread.join(10)
    assert not thread.is_alive()


def test_replay_at_full_speed_plays_past_the_history(trace_events):
    c = Collector()
    driver = ReplayDriver(trace_events, c.publish, speed=0, max_history=5)
    thread = start(driver)
    c.wait(lambda: c.status is not None and c.status.done, timeout=30)
    assert c.state.step == len([e for e in trace_events if e.kind == "step_summary"])
    assert c.status.history == 5
    driver.stop()
    thread.join(5)
    assert not thread.is_alive()


def test_forward_and_step_past_the_history_make_new_steps(trace_events):
    c = Collector()
    driver = ReplayDriver(trace_events, c.publish, paused=True, speed=0, max_history=3)
    thread = start(driver)
    c.wait(lambda: c.status is not None and not c.status.loading)
    for n in range(1, 9):  # `→` and `s` at the newest step, beyond 3 recorded steps
        driver.send(Forward() if n % 2 else Step())
        c.wait(lambda n=n: c.state.step == n, timeout=10)
    driver.stop()
    thread.join(5)


def test_pilot_plays_past_the_history_at_the_highest_speed_and_keeps_answering_keys():
    def make(publish, notify):
        return Endless(publish, notify=notify, speed=SPEEDS[-1])

    async def go():
        app = VizApp(make)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.state.step > MAX_HISTORY + 20, timeout=60)
            await pilot.press("space")
            # Paused, and the screen has caught up with the worker's cursor.
            await wait_until(pilot, lambda: app.status.paused and app.state is app.driver.state)
            step = app.state.step
            assert app.status.behind == 0 and app.status.history == MAX_HISTORY
            await pilot.press("right")  # at the newest step, with the history full
            await wait_until(pilot, lambda: app.state.step == step + 1)
            await pilot.press("s")
            await wait_until(pilot, lambda: app.state.step == step + 2)
            await pilot.press("space")  # play again, at the highest speed
            await wait_until(pilot, lambda: app.state.step > step + 40)
            await pilot.press("s")  # `s` while playing fast: pauses
            await wait_until(pilot, lambda: app.status.paused)
            assert f"step {app.state.step}" in screen_text(app).splitlines()[0]
            await pilot.press("q")
            await wait_until(pilot, lambda: not app.is_running)

    asyncio.run(go())


def test_headless_screenshot_past_the_history_ends(tiny_llama: Path, tmp_path: Path):
    """`nanovllm viz --screenshot out.txt --steps N` on a live engine, N past the history
    (the issue's `--scenario prefix --steps 320` never ended)."""
    out = tmp_path / "out.txt"
    steps = MAX_HISTORY + 20
    args = ["--model", str(tiny_llama), "--scenario", "prefix"]
    args += ["--screenshot", str(out), "--steps", str(steps), "--size", "100x30"]
    done = subprocess.run(
        [sys.executable, "-m", "nanovllm", "viz", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"(step {steps})" in done.stdout
    assert f"step {steps}" in out.read_text().splitlines()[0]


# --- the pace ----------------------------------------------------------------------------------


def test_every_animated_pace_holds_an_event_as_long_as_the_next():
    """The pace sets events per second: however many events a step has, each one is on screen
    for the same time, and at the default pace long enough to follow."""
    assert animates(DEFAULT_SPEED) and event_seconds(DEFAULT_SPEED) >= READABLE_S
    paces = [s for s in SPEEDS if animates(s)]
    assert paces == sorted(paces) and paces[0] < DEFAULT_SPEED
    holds = [event_seconds(s) for s in paces]
    assert holds == sorted(holds, reverse=True)  # faster is faster


def test_default_pace_keeps_each_event_on_screen(trace_events):
    """Measured on the driver: the moves within a step of the trace's (a step of dozens of
    events) are published at least `READABLE_S` apart at the default pace."""
    c = Collector()
    times: list[tuple[float, int]] = []

    def publish(state, status):
        times.append((time.monotonic(), status.event))
        c.publish(state, status)

    driver = ReplayDriver(trace_events, publish, speed=DEFAULT_SPEED)
    thread = start(driver)
    c.wait(lambda: c.status is not None and c.status.event >= 4, timeout=10)
    driver.stop()
    thread.join(5)
    moves = [t for t, event in times if event > 0]
    assert c.status.num_step_events > 10  # a long step, which used to rush
    gaps = [b - a for a, b in zip(moves, moves[1:])]
    assert len(gaps) >= 3 and min(gaps) >= READABLE_S * 0.95, gaps


def test_the_pace_shows_while_paused(trace_path: Path):
    """`+` / `-` while paused: the top line shows the new pace at once."""

    def make(publish, notify):
        return ReplayDriver(trace_path, publish, notify=notify, paused=True)

    async def go():
        app = VizApp(make)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: app.status is not None and not app.status.loading)
            top = lambda: screen_text(app).splitlines()[0]  # noqa: E731
            assert "paused" in top() and "4 events/s" in top()
            await pilot.press("plus")
            await wait_until(pilot, lambda: "8 events/s" in top())
            await pilot.press("plus", "plus")
            await wait_until(pilot, lambda: "16 steps/s" in top())
            assert "paused" in top()

    asyncio.run(go())


def test_engine_driver_module_imports_only_the_public_api():
    """The viz runs the engine through `nanovllm`'s public names, nothing deeper."""
    import inspect

    from nanovllm.viz import driver

    source = inspect.getsource(driver)
    for internal in ("nanovllm.engine", "nanovllm.core", "nanovllm.config", "nanovllm.sampling"):
        assert internal not in source, internal
    assert EngineDriver.__module__ == driver.__name__
