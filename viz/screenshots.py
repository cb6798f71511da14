"""Screenshots of every scenario at the four sizes the README shows, made the way a user would:

    python -m nanovllm.viz.screenshots viz/screenshots      # or any folder

One headless app plays the scenarios one after the other (switched as the `1`-`8` keys switch
them, so torch loads once), each at full speed to its step in `STEPS`, then takes the screen at
80x24, 100x30, 120x40 and 160x48, the terminal resized in place, as `NAME-WxH.svg`. The test of
the layouts (`tests/viz/test_viz_layouts.py`) drives the same `play` with fewer steps and checks
the screens' text instead.

The engine's timings (a step's scheduling and forward time, and the tokens/s made of them) differ
from run to run; the driver here leaves them out (`UntimedDriver`: the metrics show `—`), so the
pictures are the same every run and a diff shows only what a change to the views changed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from pathlib import Path

from nanovllm.events import Event, StepSummary
from nanovllm.viz.app import VizApp, screen_text
from nanovllm.viz.driver import EngineDriver, SwitchScenario, TogglePause
from nanovllm.viz.scenarios import SCENARIOS

SIZES: tuple[tuple[int, int], ...] = ((80, 24), (100, 30), (120, 40), (160, 48))
# The step each scenario's pictures show: where its idea is on screen (see the README's table).
STEPS = {
    "steady": 12,
    "burst": 35,  # preempted requests back at the front of the waiting queue
    "prefix": 20,  # the system prompt's blocks shared, and pulled back from the free queue
    "chunked": 12,  # a prompt prefilled in chunks beside decodes
    "speculative": 20,
    "parallel": 12,
    "offload": 38,  # blocks loaded back from the host tier
    "disagg": 40,
    "hybrid": 30,  # every request past the window: its sliding table starts with ∅
    "moe": 12,  # prefills beside decodes: a step's tokens spread unevenly over the experts
}

Shoot = Callable[[VizApp, str, tuple[int, int]], Awaitable[None] | None]


class UntimedDriver(EngineDriver):
    """The live engine, its steps' timings left out (zero: the views show `—`)."""

    def _on_event(self, event: Event) -> None:
        if isinstance(event, StepSummary):
            event = replace(event, schedule_time=0.0, forward_time=0.0, rank_forward_times=())
        super()._on_event(event)


async def _settle(pilot, until: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise TimeoutError("the scenario did not reach its step")
        await pilot.pause(0.05)
    for _ in range(3):  # the last frame drawn, titles fitted
        await pilot.pause()


async def play(
    pilot,
    scenarios: Iterable[str],
    steps: dict[str, int],
    sizes: Iterable[tuple[int, int]],
    shoot: Shoot,
    timeout: float = 300.0,
    notices: list[str] | None = None,
) -> None:
    """Play each scenario to its step, then call `shoot(app, scenario, size)` at each size.
    The notifications on screen then (the scenario's "what to watch") are cleared first, and
    their texts appended to `notices`."""
    app: VizApp = pilot.app
    driver = app.driver
    assert isinstance(driver, EngineDriver)
    for name in scenarios:
        driver.max_steps = steps[name]
        driver.send(SwitchScenario(name))
        driver.send(TogglePause())  # switching leaves it paused; play to the step

        def there(name: str = name) -> bool:
            status = app.status
            return (
                status is not None
                and status.scenario == name
                and not status.loading
                and status.paused
                and not status.event
                and app.state.step == steps[name]
            ) or bool(status and status.error)

        await _settle(pilot, there, timeout)
        if app.status is not None and app.status.error:
            raise RuntimeError(f"{name}: {app.status.error}")
        if notices is not None:
            notices.extend(n.message for n in app._notifications)
        app.clear_notifications()
        for size in sizes:
            await pilot.resize_terminal(*size)
            await pilot.pause(0.05)
            await _settle(pilot, lambda size=size: tuple(app.size) == size, timeout)
            result = shoot(app, name, size)
            if result is not None:
                await result


def screenshot_app(first: str) -> VizApp:
    """A headless app on the embedded model, paused before its first step."""

    def make(publish, notify):
        return UntimedDriver(publish, notify=notify, scenario=first, speed=0, paused=True)

    return VizApp(make)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanovllm.viz.screenshots")
    parser.add_argument("outdir", type=Path, help="folder for NAME-WxH.svg")
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    parser.add_argument("--text", action="store_true", help="also NAME-WxH.txt, for diffs")
    args = parser.parse_args(argv)
    names = args.scenario or list(SCENARIOS)
    args.outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def shoot(app: VizApp, name: str, size: tuple[int, int]) -> None:
        path = args.outdir / f"{name}-{size[0]}x{size[1]}.svg"
        title = f"nanovllm viz --scenario {name} · step {app.state.step} · {size[0]}x{size[1]}"
        path.write_text(app.export_screenshot(title=title), encoding="utf-8")
        written.append(path)
        if args.text:
            path.with_suffix(".txt").write_text(screen_text(app), encoding="utf-8")

    async def go(pilot) -> None:
        await play(pilot, names, STEPS, SIZES, shoot)
        pilot.app.exit()

    start = time.perf_counter()
    screenshot_app(names[0]).run(headless=True, size=SIZES[-1], auto_pilot=go)
    print(
        f"wrote {len(written)} screenshots to {args.outdir} in {time.perf_counter() - start:.0f} s"
    )
    return 0 if len(written) == len(names) * len(SIZES) else 1


if __name__ == "__main__":
    sys.exit(main())
