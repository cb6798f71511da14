"""The Textual app, driven with Pilot from the committed trace (replay: no model, deterministic).

Snapshots: the screen at a given step is compared with files under `tests/viz/data/snapshots/`,
as plain text (readable in a diff) and as the SVG Textual exports (colours included). After a
deliberate change to the views, or after regenerating the trace, rewrite them with

    VIZ_UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/viz -k snapshot

and look at the new files before committing them.
"""

from __future__ import annotations

import asyncio
import json
import os
from functools import partial
from pathlib import Path

import pytest
from viz_helpers import wait_until

from nanovllm.viz.app import VizApp, save_screenshot, screen_text
from nanovllm.viz.driver import ReplayDriver
from nanovllm.viz.messages import EngineNotice
from nanovllm.viz.screens import AddRequestScreen, HelpScreen
from nanovllm.viz.state import RUNNING

SNAPSHOTS = Path(__file__).resolve().parent / "data" / "snapshots"
UPDATE = os.environ.get("VIZ_UPDATE_SNAPSHOTS") == "1"


def replay_app(trace: Path, **driver_options) -> VizApp:
    def make(publish, notify):
        return ReplayDriver(trace, publish, notify=notify, **driver_options)

    return VizApp(make)


def run(coro) -> None:
    asyncio.run(coro)


def loaded(app: VizApp) -> bool:
    return app.status is not None and not app.status.loading


def test_pause_step_and_speed_keys(trace_path: Path):
    async def go():
        app = replay_app(trace_path, paused=True, speed=16)  # `s`: whole steps
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: loaded(app))
            assert app.state.step == 0 and app.status.paused
            for n in range(1, 4):
                await pilot.press("s")
                await wait_until(pilot, lambda n=n: app.state.step == n)
            await pilot.press("right")
            await wait_until(pilot, lambda: app.state.step == 4)
            speed = app.status.speed
            await pilot.press("plus")
            await wait_until(pilot, lambda: app.status.speed > speed)
            await pilot.press("minus", "minus")
            await wait_until(pilot, lambda: app.status.speed < speed)
            await pilot.press("space")  # resume
            await wait_until(pilot, lambda: not app.status.paused)
            await pilot.press("space")  # pause again
            await wait_until(pilot, lambda: app.status.paused)
            step = app.state.step
            await pilot.pause(0.3)
            assert app.state.step == step  # paused means paused
            await pilot.press("s")
            await wait_until(pilot, lambda: app.state.step == step + 1)

    run(go())


def test_select_requests_with_keys_and_mouse(trace_path: Path):
    async def go():
        app = replay_app(trace_path, speed=0, max_steps=12)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.step == 12)
            # Following: the oldest running request is selected.
            assert app.selected == app.state.running[0] and app.follow
            text = app.query_one("#text")
            assert app.selected in screen_text(app)
            order = app._selectable()
            await pilot.press("down")
            await wait_until(pilot, lambda: not app.follow)
            expected = order[(order.index(app.state.running[0]) + 1) % len(order)]
            assert app.selected == expected
            assert text.selected == expected
            await pilot.press("up", "up")
            # Click the first waiting request: line 1 of the queues view.
            await pilot.click("#queues", offset=(4, 2))
            await wait_until(pilot, lambda: app.selected == app.state.waiting[0])

    run(go())


def test_help_screen_and_quit(trace_path: Path):
    async def go():
        app = replay_app(trace_path, paused=True)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: loaded(app))
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
            await wait_until(pilot, lambda: "one event of the step" in screen_text(app))
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))
            await pilot.press("q")
            await wait_until(pilot, lambda: not app.is_running)
        assert app.engine_thread is not None
        app.engine_thread.join(5)
        assert not app.engine_thread.is_alive()  # the engine's thread ended too

    run(go())


def test_replay_hides_live_only_keys(trace_path: Path):
    """A replay has no model: `a` and the scenario keys are neither offered nor acted on."""
    notices: list[str] = []

    def hook(message) -> None:
        if isinstance(message, EngineNotice):
            notices.append(message.text)

    async def go():
        app = replay_app(trace_path, paused=True)
        async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
            await wait_until(pilot, lambda: loaded(app) and app.is_settled())
            footer = screen_text(app).splitlines()[-1]
            assert "quit" in footer and "add" not in footer and "scenario" not in footer
            await pilot.press("a", "2", "c")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, AddRequestScreen)
            assert notices == [] and app.status.mode == "replay"

    run(go())


def test_too_small_terminal_shows_a_message(trace_path: Path):
    async def go():
        app = replay_app(trace_path, speed=0, max_steps=5)
        async with app.run_test(size=(50, 12)) as pilot:
            await wait_until(pilot, lambda: app.state.step == 5)
            assert app.screen.has_class("-too-small")
            assert "needs at least" in screen_text(app)
            await pilot.resize_terminal(100, 30)
            await wait_until(pilot, lambda: not app.screen.has_class("-too-small"))
            assert "Batch timeline" in screen_text(app)

    run(go())


def test_no_color_still_reads(trace_path: Path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")

    async def go():
        app = replay_app(trace_path, speed=0, max_steps=10)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.step == 10)
            assert app.no_color
            text = screen_text(app)
            # The letters carry the meaning without colour: timeline cells, grid owners.
            assert "P=" in text and " A²" in text

    run(go())


def test_live_app_on_the_tiny_model(tiny_llama: Path):
    from nanovllm.viz.driver import EngineDriver

    def make(publish, notify):
        return EngineDriver(
            publish,
            notify=notify,
            scenario="burst",
            overrides=dict(model=str(tiny_llama), num_threads=1),
            speed=0,
            max_steps=3,
        )

    async def go():
        app = VizApp(make)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.step == 3, timeout=120)
            assert app.state.running and app.state.requests[app.selected].status == RUNNING
            await pilot.press("a")
            await pilot.press(*"ROMEO", "enter")
            await wait_until(pilot, lambda: "you1" in app.state.requests)
            await pilot.press("1")  # steady
            await wait_until(pilot, lambda: app.status.scenario == "steady" and loaded(app))
            await pilot.press("s")
            await wait_until(pilot, lambda: app.state.step == 1)

    run(go())


def test_live_app_on_two_ranks(tiny_llama: Path):
    """`nanovllm viz --tensor-parallel-size 2`: the engine's worker process starts from inside
    the running app (whose stderr capture has no file descriptor), the top line shows the
    ranks' forward times, a scenario switch stops the old engine's workers before the new
    engine starts its own, and quitting leaves no worker behind."""
    import multiprocessing

    from nanovllm.viz.driver import EngineDriver

    def make(publish, notify):
        return EngineDriver(
            publish,
            notify=notify,
            scenario="steady",
            overrides=dict(model=str(tiny_llama), num_threads=1, tensor_parallel_size=2),
            speed=0,
            max_steps=2,
        )

    async def go():
        app = VizApp(make)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.state.step == 2 and loaded(app), timeout=120)
            assert app.status.error is None
            await wait_until(pilot, lambda: "2 ranks · forward" in screen_text(app).splitlines()[0])
            await pilot.press("2")  # burst: a new engine on 2 ranks
            await wait_until(pilot, lambda: app.status.scenario == "burst" and loaded(app))
            await pilot.press("s")
            await wait_until(pilot, lambda: app.state.step == 1, timeout=120)
            assert app.status.error is None

    run(go())
    assert multiprocessing.active_children() == []


# --- snapshots ----------------------------------------------------------------------------------


def check_snapshot(path: Path, content: str) -> None:
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"wrote the missing snapshot {path.name}; check it and run again")
    assert content == path.read_text(encoding="utf-8"), f"the screen differs from {path}"


async def press_events(pilot, app: VizApp, n: int) -> None:
    """Press `e` n times, each time waiting for exactly one more event on screen."""
    for _ in range(n):
        seen = app.state.num_events
        await pilot.press("e")
        await wait_until(pilot, lambda seen=seen: app.state.num_events == seen + 1)


@pytest.mark.parametrize(
    "name, size, step, events",
    [
        ("small_80x24", (80, 24), 44, 0),  # a prefix hit pulls ten blocks out of the queue
        ("medium_100x30", (100, 30), 10, 8),  # mid-step 11: preempted, then a block taken
        ("medium_120x40", (120, 40), 59, 0),  # rejected proposals: blocks freed mid-run
        ("wide_160x48", (160, 48), 60, 0),  # three children (n=3) verify proposals
    ],
)
def test_snapshot(trace_path: Path, name: str, size: tuple[int, int], step: int, events: int):
    async def go():
        app = replay_app(trace_path, speed=0, max_steps=step)
        async with app.run_test(size=size) as pilot:
            await wait_until(
                pilot, lambda: app.state.step == step and app.status.paused and app.is_settled()
            )
            await press_events(pilot, app, events)
            # Which request is followed depends on the states the UI happened to draw: pin it.
            app.select(app._selectable()[0])
            await pilot.pause()
            check_snapshot(SNAPSHOTS / f"{name}.txt", screen_text(app))
            check_snapshot(SNAPSHOTS / f"{name}.svg", app.export_screenshot())

    run(go())


def test_resize_mid_run_never_crashes(trace_path: Path):
    """Shrink and grow across every layout while the replay plays; each size draws its views."""
    sizes = [(160, 48), (80, 24), (100, 30), (60, 16), (200, 60)]

    async def go():
        # Slow enough that the trace (~50 steps) is still playing after the last resize, even on
        # a machine where drawing each layout takes a while.
        app = replay_app(trace_path, speed=4)
        async with app.run_test(size=sizes[0]) as pilot:
            await wait_until(pilot, lambda: app.state.step >= 3)
            for width, height in sizes[1:]:
                await pilot.resize_terminal(width, height)
                before = app.state.num_events
                await wait_until(pilot, lambda b=before: app.state.num_events > b)
                text = screen_text(app)
                assert len(text.splitlines()) == height
                assert "Batch timeline" in text and "Physical KV cache" in text
                assert ("Free block queue" in text) == (height >= 24), (width, height)
                # Block tables at every width with room for them: in the middle from 100 columns
                # on, under the queues below that.
                if height >= 24:
                    assert "Block tables" in text, (width, height)
            assert app.is_running
        assert app.return_code in (None, 0)

    run(go())


def test_event_keys_and_history(trace_path: Path):
    """`e` plays one event, `s` the rest of the step, left/right walk the recorded steps."""

    async def go():
        app = replay_app(trace_path, speed=0, max_steps=12)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: app.state.step == 12 and app.status.paused)
            at_12 = app.state
            await press_events(pilot, app, 3)
            assert app.status.event == 3 and app.state.step == 12
            assert "event 3/" in screen_text(app).splitlines()[0]
            await pilot.press("s")  # the rest of step 13 at once (speed 0: no animation)
            await wait_until(pilot, lambda: app.state.step == 13 and app.status.event == 0)
            at_13 = app.state
            await pilot.press("left", "left")
            await wait_until(pilot, lambda: app.state.step == 11)
            assert "history: 2 steps back" in screen_text(app)
            await pilot.press("right")
            await wait_until(pilot, lambda: app.state.step == 12)
            assert app.state is at_12  # the very state drawn before: nothing recomputed
            await pilot.press("end")
            await wait_until(pilot, lambda: app.state.step == 13)
            assert app.state is at_13 and app.status.behind == 0

    run(go())


def test_save_screenshot_formats(trace_path: Path, tmp_path: Path):
    async def go():
        app = replay_app(trace_path, speed=0, max_steps=3)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.state.step == 3)
            svg = save_screenshot(app, tmp_path / "a.svg")
            txt = save_screenshot(app, tmp_path / "a.txt")
            png = save_screenshot(app, tmp_path / "a.png")
            assert svg.read_text().startswith("<svg")
            assert "Batch timeline" in txt.read_text()
            assert png.exists()  # a PNG with a converter, else the SVG beside it

    run(go())


def test_app_factory_with_partial(trace_path: Path):
    """The CLI builds drivers with functools.partial; the app only calls the factory."""
    calls = []

    def make(trace, publish, notify):
        calls.append(trace)
        return ReplayDriver(trace, publish, notify=notify, paused=True)

    app = VizApp(partial(make, trace_path))
    assert calls == [trace_path] and isinstance(app.driver, ReplayDriver)


def test_the_ranks_of_a_step_show_in_the_top_line(trace_path: Path, tmp_path: Path):
    """With tensor parallelism the top line names the ranks and each one's forward time in the
    last step, at the smallest layout too (80x24); the wide layout's metrics list them again.
    The committed trace, as if its engine had run on 2 ranks."""
    lines = []
    for line in trace_path.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event["kind"] == "engine_started":
            event["tensor_parallel_size"] = 2
        elif event["kind"] == "step_summary":
            event["rank_forward_times"] = [0.0031 + event["step"] / 1e4, 0.0029]
        lines.append(json.dumps(event))
    trace = tmp_path / "tp2.jsonl"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")

    async def go():
        app = replay_app(trace, speed=0, max_steps=5)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(
                pilot, lambda: app.state.step == 5 and app.status.paused and app.is_settled()
            )
            await pilot.pause()
            top = screen_text(app).splitlines()[0]
            assert "2 ranks · forward 3.6 / 2.9 ms" in top, top
            await pilot.resize_terminal(160, 48)  # the wide layout shows the metrics
            await wait_until(pilot, lambda: "2 ranks  3.6 / 2.9 ms" in screen_text(app))

    run(go())
