"""Layouts (issue 41, section 4): every scenario, live on the embedded model, at 80x24, 100x30,
120x40 and 160x48, the terminal resized in place (`viz/screenshots.py`'s `play`, a few steps a
scenario). No label is cut mid-word (a letter or digit right before `…`), the `disagg` link
narrows below 150 columns, the tier's panel has its whole legend and names CPU memory, and
switching scenario says what to watch. The same screens with the executor panel open (`x`,
issue 53): no word cut, every panel of the middle column whole on screen (none pushed off
below the panel), and the selected request's six flat inputs and block reads in the panel."""

from __future__ import annotations

import re
import time

import pytest

from nanovllm.viz.app import VizApp, screen_text
from nanovllm.viz.executor import slot_label
from nanovllm.viz.scenarios import SCENARIOS
from nanovllm.viz.screenshots import SIZES, play, screenshot_app
from nanovllm.viz.widgets import ExecutorView

CUT = re.compile(r"[^\W_]…")  # `decod…`: a word cut short
MARKER = re.compile(r"…\d+ more…")  # the free queue's count of the blocks it leaves out


def cut_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if CUT.search(MARKER.sub("", line))]


def test_cut_lines_finds_a_word_cut_short():
    assert cut_lines("╰─ P prefill · p chunk · = decod… ─╯\n│ ▸ 1 …19 more… 4 ◂ │") == [
        "╰─ P prefill · p chunk · = decod… ─╯"
    ]


@pytest.mark.slow
def test_every_scenario_at_every_size():
    screens: dict[tuple[str, tuple[int, int]], str] = {}
    widths: dict[tuple[int, int], tuple[int, int, int]] = {}
    notices: list[str] = []
    executor: dict[tuple[str, tuple[int, int]], str] = {}

    async def shoot(app: VizApp, name: str, size: tuple[int, int]) -> None:
        screens[name, size] = screen_text(app)
        if name == "disagg":
            widths[size] = tuple(  # type: ignore[assignment]
                app.query_one(f"#{i}").outer_size.width for i in ("prefill", "link", "decode")
            )
            return  # (two engines: no executor panel)
        app.action_toggle_executor()  # `x`
        for _ in range(3):
            await app._pilot_pause()
        executor[name, size] = check_executor(app)
        app.action_toggle_executor()
        await app._pilot_pause()

    async def go(pilot) -> None:
        pilot.app._pilot_pause = pilot.pause
        await play(pilot, SCENARIOS, dict.fromkeys(SCENARIOS, 3), SIZES, shoot, notices=notices)
        pilot.app.exit()

    start = time.monotonic()
    screenshot_app(next(iter(SCENARIOS))).run(headless=True, size=SIZES[-1], auto_pilot=go)
    took = time.monotonic() - start
    assert len(screens) == len(SCENARIOS) * len(SIZES), took
    assert len(executor) == (len(SCENARIOS) - 1) * len(SIZES), took
    bad = [f"{name} {w}x{h}: {line}" for (name, (w, h)), text in executor.items()
           for line in cut_lines(text)]  # fmt: skip
    assert not bad, "\n".join(bad)

    bad = [f"{name} {w}x{h}: {line}" for (name, (w, h)), text in screens.items()
           for line in cut_lines(text)]  # fmt: skip
    assert not bad, "\n".join(bad)
    # Below 150 columns the link narrows; each engine gets the rest.
    for (w, _h), (prefill, link, decode) in widths.items():
        if w < 150:
            assert link <= 26 and min(prefill, decode) >= (w - link) // 2 - 1, (w, widths)
    # The tier's panel: CPU memory, and its whole legend from 40 rows (below, the lines left).
    for size in SIZES:
        text = screens["offload", size]
        assert "CPU" in text, size
        if size[1] >= 40:
            for item in ("holds a prefix", "+ saved", "⇡ loaded", "▾ dropped next", "· empty"):
                assert item in text, (size, item, text)
            assert "✕ dropped" in text, (size, text)
    # The hybrid scenario: the null block in the grid at every size; where the block tables
    # show (from 100 columns), a request's full table, and from 120 its sliding one too, the
    # blocks the window passed as the null block (at 100x30 the panel's four rows hold only
    # the first request's full table).
    for size in SIZES:
        text = screens["hybrid", size]
        assert "∅" in text, (size, text)
        if size[0] >= 100:
            assert "full [" in text, (size, text)
        if size[0] >= 120:
            assert "win32 [∅" in text, (size, text)
    # The moe scenario: the experts panel, with every layer's row where rows allow (from 30
    # rows), the others counted.
    for size in SIZES:
        text = screens["moe", size]
        assert "each to 2 of 8 experts" in text and "L0 " in text, (size, text)
        assert ("L3 " in text) == (size[1] >= 30) and ("more layers" in text) == (size[1] < 30)
    # Switching scenario says what to watch.
    for scenario in SCENARIOS.values():
        assert any(scenario.what_to_watch in n for n in notices), scenario.name


def check_executor(app: VizApp) -> str:
    """With the executor panel open: every panel of the middle column whole on screen (D8:
    speculative at 80x24 showed the free queue's top border alone), and the selected request's
    six flat inputs and first block read in the panel (D3). The screen's text."""
    center = app.query_one("#center")
    for view in center.query("StateView"):
        region = view.region  # (empty when it, or the row holding it, is not displayed)
        if region.area:
            assert center.region.contains_region(region) and region.height >= 3, (view, region)
    view = app.query_one(ExecutorView)
    ex = view.state.executor
    text = view.render().plain
    assert ex is not None, text
    inputs = ex.inputs
    i = inputs.request_ids.index(view.selected) if view.selected in inputs.request_ids else 0
    first, rid = inputs.query_start_loc[i], inputs.request_ids[i]
    for label in ("row", "token", "id", "pos", "slot", "logits"):
        assert any(line.lstrip("◂").startswith(label + " ") for line in text.splitlines()), text
    assert str(inputs.input_ids[first]) in text and str(inputs.positions[first]) in text, text
    assert slot_label(inputs.slot_mapping[first], inputs.block_size) in text, text
    count = inputs.query_start_loc[i + 1] - first
    assert f"{rid} q@{first} ×{count} ctx {inputs.seq_lens[i]} [" in text, text
    assert f"L0→#{inputs.block_tables[i][0]}[" in text, text
    return screen_text(app)
