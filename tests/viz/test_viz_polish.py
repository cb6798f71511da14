"""The defects found when the visualizer was tried as a new user would (issue 41, section 3),
each checked against what the state says: the counts a view prints against the state's own
counts, the pace keys against the commands sent, quitting against a source that never yields.

The views are rendered without a screen: `rendered` gives a view a size and a state and calls
its `render`, the same call Textual makes.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from io import StringIO
from pathlib import Path

from budget import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text
from textual.geometry import Size
from viz_helpers import engine_started, wait_until

from nanovllm.events import (
    BlockAllocated,
    BlockFreed,
    CacheHit,
    RequestAdded,
    RequestFinished,
    RequestScheduled,
    StepSummary,
    TokenEmitted,
)
from nanovllm.viz.app import VizApp
from nanovllm.viz.driver import Driver, EngineDriver, ReplayDriver, SetSpeed
from nanovllm.viz.scenarios import SCENARIOS
from nanovllm.viz.state import VizState, reduce, reduce_all, table_holders
from nanovllm.viz.style import escape_token
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.widgets.block_tables import BlockTablesView
from nanovllm.viz.widgets.free_queue import FreeQueueView
from nanovllm.viz.widgets.metrics import MetricsView
from nanovllm.viz.widgets.paging import PagingView, slot_layout
from nanovllm.viz.widgets.queues import QueuesView
from nanovllm.viz.widgets.step_view import StepView, segment_widths
from nanovllm.viz.widgets.timeline import TimelineView


def rendered(cls: type[StateView], state: VizState, width: int, height: int, selected=None):
    """The lines `cls` draws for `state` in a `width`×`height` content area."""

    class Sized(cls):  # type: ignore[misc, valid-type]
        @property
        def size(self) -> Size:
            return Size(width, height)

    view = Sized()
    view.state, view.selected = state, selected
    out = view.render()
    if isinstance(out, Text):
        return out.plain.split("\n")
    console = Console(width=width, file=StringIO(), color_system=None)  # a table, say
    with console.capture() as captured:
        console.print(out)
    return captured.get().splitlines()


def running_requests(
    n: int, blocks_each: int = 1, num_blocks: int = 64, started=None, window_blocks: int = 0
) -> VizState:
    """`n` requests admitted in step 1, each with `blocks_each` blocks, decoding in step 2
    (`started`: the engine's description; `window_blocks`: each request's last blocks in KV
    cache group 1 too, a sliding one, the null block before them)."""
    events: list = [started or engine_started(num_blocks)]
    block = 0 if events[0].null_block is None else 1
    for i in range(n):
        rid = f"r{i}"
        events.append(RequestAdded(rid, "abc", 3, 4, ("a", "b", "c")))
        for logical in range(blocks_each):
            events.append(BlockAllocated(rid, block, logical))
            block += 1
        for logical in range(max(blocks_each - window_blocks, 0), blocks_each):
            events.append(BlockAllocated(rid, block, logical, True, 1))
            block += 1
    for step, prefill in ((1, True), (2, False)):
        for i in range(n):
            events.append(RequestScheduled(step, f"r{i}", 3 if prefill else 1, 0, prefill, False))
        used = block - (events[0].null_block is not None)
        tokens = 3 * n if prefill else n
        events.append(
            StepSummary(step, {f"r{i}": 1 for i in range(n)}, tokens if prefill else 0,
                        0 if prefill else tokens, n, 0, used, 0, num_blocks - used, 0, 0,
                        1e-4, 1e-3, token_budget=512)
        )  # fmt: skip
    return reduce_all(VizState(), events)


# --- block tables count the requests they do not show ------------------------------------------


@settings(max_examples=examples(40), deadline=None)
@example(n=12, blocks_each=1, width=60, height=5)  # the 100x30 case: `… 7 more` under 4 rows
@given(n=st.integers(2, 14), blocks_each=st.integers(1, 12), width=st.integers(24, 80),
       height=st.integers(1, 14))  # fmt: skip
def test_block_tables_count_every_request_not_shown(n, blocks_each, width, height):
    """Requests drawn (each one's letter opening its tables) plus `… N more` are all the
    holders: at 100x30 with 12 running, four rows used to say `… 7 more`."""
    state = running_requests(n, blocks_each, num_blocks=n * blocks_each + 4)
    lines = rendered(BlockTablesView, state, width, height)
    assert len(lines) <= height
    # A request drawn: its letter opening a line (`A r0 [...]`) or a table (`A[...]`, side by
    # side when the panel is short).
    shown = sum(len(re.findall(r"(?:^|(?<= ))[A-Z](?= r\d|\[)", line)) for line in lines)
    more = [int(m) for line in lines for m in re.findall(r"^… (\d+) more", line)]
    assert shown + sum(more) == len(table_holders(state)), lines


# --- the step bar singles out nobody among equals ----------------------------------------------


def test_all_one_token_decodes_get_no_cell():
    """Twelve one-token decodes in a 512-token budget on a 64-cell bar: none is drawn (the old
    running total gave the fifth a cell, `▕e +11 more`)."""
    assert segment_widths([1] * 12, 512, 64) == [0] * 12
    lines = rendered(StepView, running_requests(12), 66, 4)
    bar = lines[1]
    assert not re.search(r"[a-zA-Z]", bar.split(" ")[0].strip("▕")), bar
    assert "12 requests, each under a cell" in bar


@settings(max_examples=examples(60))
@given(tokens=st.lists(st.integers(1, 600), min_size=1, max_size=16),
       budget=st.integers(1, 2048), width=st.integers(1, 200))  # fmt: skip
def test_a_segment_is_drawn_only_for_a_share_of_half_a_cell(tokens, budget, width):
    widths = segment_widths(tokens, budget, width)
    scale = width / max(budget, sum(tokens), 1)
    assert sum(widths) <= width
    for t, w in zip(tokens, widths):
        assert w >= 0
        if t * scale < 0.5:
            assert w == 0  # too small: not drawn, whichever its neighbours are
        assert abs(w - t * scale) < 1.5  # in proportion


# --- the shortened free queue keeps its head and counts in words --------------------------------


def free_queue_after_taking(taken: int, num_blocks: int) -> VizState:
    """A step that took `taken` blocks from the head of a `num_blocks` queue (one request)."""
    events: list = [engine_started(num_blocks), RequestAdded("r0", "abc", 3, 4, ("a",))]
    events += [BlockAllocated("r0", b, b) for b in range(taken)]
    return reduce_all(VizState(), events)


@settings(max_examples=examples(40), deadline=None)
@given(taken=st.integers(0, 60), num_blocks=st.integers(8, 128), width=st.integers(30, 160),
       height=st.integers(3, 5))  # fmt: skip
def test_the_shortened_free_queue_keeps_its_head(taken, num_blocks, width, height):
    taken = min(taken, num_blocks - 1)
    state = free_queue_after_taking(taken, num_blocks)
    lines = rendered(FreeQueueView, state, width, height)
    strip = " ".join(lines[1:-1])
    head = state.free_queue[0]
    # `▸` and the head block right after it, always.
    assert re.search(rf"▸\s+▾?{head}\b", strip), strip
    elided = re.findall(r"…(\d+) more…", strip)
    assert not re.search(r"…\d+…", strip)  # never a bare number between dots
    shown = [int(x) for x in re.findall(r"(?<![←↑\d…])\b(\d+)\b(?! more)", strip)]
    assert len(shown) + sum(map(int, elided)) == len(state.free_queue), strip


# --- the pace keys start from the pace the keys set ---------------------------------------------


def test_quick_pace_presses_are_all_counted(trace_path: Path):
    """Three `+` before any frame shows the new pace: three paces up, not one. The driver
    here never hears of them, so the frames keep the old pace, as between two quick presses."""
    sent: list[float] = []

    def make(publish, notify):
        driver = ReplayDriver(trace_path, publish, notify=notify, paused=True, speed=2)
        send = driver.send

        def intercept(command) -> None:
            if isinstance(command, SetSpeed):
                sent.append(command.steps_per_s)
            else:
                send(command)

        driver.send = intercept  # type: ignore[method-assign]
        return driver

    async def go() -> None:
        app = VizApp(make)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.status is not None and not app.status.loading)
            await pilot.press("plus", "plus", "plus", "minus")
            await wait_until(pilot, lambda: len(sent) == 4)
        assert sent == [4, 8, 16, 8]

    asyncio.run(go())


# --- `q` does not wait for the engine -----------------------------------------------------------


class Stuck(Driver):
    """A source whose setup takes as long as loading a model on a busy machine, and more."""

    def __init__(self, publish, notify, release: threading.Event) -> None:
        super().__init__(publish, notify)
        self.release = release

    def setup(self) -> None:
        self.release.wait(30)

    def pull(self) -> bool:
        return False


def test_quit_does_not_wait_for_the_engine_thread():
    """`q` while the source is busy (loading, or in a long step) ends the app at once: the
    engine's thread used to be a Textual worker, whose executor the app joins on exit."""
    release = threading.Event()

    async def go() -> None:
        app = VizApp(lambda publish, notify: Stuck(publish, notify, release))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(0.2)
            await pilot.press("q")
            await wait_until(pilot, lambda: not app.is_running, timeout=10)

    start = time.monotonic()
    try:
        asyncio.run(go())  # (asyncio.run joins its default executor at the end)
        took = time.monotonic() - start
    finally:
        release.set()
    assert took < 10, took  # the stuck setup takes 30 s


# --- metrics say which step they describe ------------------------------------------------------


def test_metrics_name_the_step_they_describe(trace_events):
    """Mid-step the metrics are still the last finished step's: they say so, and which."""
    state = VizState()
    checked = 0
    for event in trace_events:
        state = reduce(state, event)
        if state.last_step is None or state.last_step.summary is None or not state.draft.events:
            continue
        text = "\n".join(rendered(MetricsView, state, 40, 20))
        step = state.last_step.summary.step
        assert f"as of      end of step {step}, {step + 1} playing" in text, text
        checked += 1
        if checked > 20:
            break
    assert checked


# --- wording ------------------------------------------------------------------------------------

ONE_PLURAL = re.compile(
    r"(?<![\d.,/])\b1 (tokens|blocks|requests|slots|prompt tokens|computed tokens)"
)


def test_story_wording_singular_and_plain():
    events = [
        engine_started(8),
        RequestAdded("a", "x", 1, 1, ("x",)),
        RequestAdded("b", "y", 1, 1, ("y",)),
        BlockAllocated("a", 0, 0),
        CacheHit("b", 0, 0, False, 2),
        RequestScheduled(1, "a", 1, 0, True, False),
        RequestScheduled(1, "b", 1, 0, True, False),
        TokenEmitted(1, "a", 7, "z", 1),
        RequestFinished(1, "a", "length", 1, 1),
        BlockFreed("a", 0, 1, False),
    ]
    texts = [n.text for n in reduce_all(VizState(), events).draft.notes]
    story = "\n".join(texts)
    assert "a arrives: 1 prompt token, first in the waiting queue" in story
    assert "b arrives: 1 prompt token, at the back of the waiting queue, 1 request ahead" in story
    assert "prefill of 1 token" in story
    assert "finished (length, 1 token)" in story
    assert "lets go of its blocks: block 0 still held by 1 other request" in story
    assert "(ref" not in story and not ONE_PLURAL.search(story), story


def test_no_one_with_a_plural_in_the_trace_story(trace_events):
    state = VizState()
    for event in trace_events:
        state = reduce(state, event)
        for note in state.draft.notes:
            assert not ONE_PLURAL.search(note.text), note.text
            assert "(ref" not in note.text and "ahead)" not in note.text, note.text


# --- paging slots: tokens apart, each as long as fits, escaped ----------------------------------

TOKENS = (" thou", " to", "\x07bell", "\n", "abcdefghijklmnopqrstuvwxyz", "é", "\t", "x")


@settings(max_examples=examples(30), deadline=None)
@given(width=st.integers(20, 120))
def test_paging_slots_keep_tokens_apart_and_show_what_fits(width):
    events: list = [engine_started(4), RequestAdded("r0", "".join(TOKENS), 8, 4, TOKENS)]
    events += [BlockAllocated("r0", 0, 0), BlockAllocated("r0", 1, 1)]
    events += [RequestScheduled(1, "r0", 8, 0, True, False)]
    state = reduce_all(VizState(), events)
    lines = rendered(PagingView, state, width, 20, selected="r0")
    label = len(f"L1 → #{state.num_blocks - 1} ")
    per_line, slot = slot_layout(4, max(1, width - label))
    shown: list[str] = []
    for line in lines:
        if re.match(r"L\d → #\d", line) or (
            shown and line.startswith(" " * label) and "ref" not in line
        ):
            shown += line[label:].split()
    expected = [escape_token(t)[: max(1, slot - 1)] for t in TOKENS]
    assert shown == expected, (lines, slot)


# --- long request ids (a server's) are shortened with a marker ----------------------------------

LONG_ID = "cmpl-9f8e7d6c5b4a39281706-0"


def test_long_request_ids_fit_their_columns():
    events: list = [engine_started(8), RequestAdded(LONG_ID, "abc", 3, 4, ("a", "b", "c"))]
    events += [BlockAllocated(LONG_ID, 0, 0), RequestScheduled(1, LONG_ID, 3, 0, True, False)]
    events += [StepSummary(1, {LONG_ID: 1}, 3, 0, 1, 0, 1, 0, 7, 3, 3, 1e-4, 1e-3, token_budget=16)]
    state = reduce_all(VizState(), events)
    for cls in (BlockTablesView, QueuesView, TimelineView, StepView):
        lines = rendered(cls, state, 50, 10)
        labels = [line for line in lines if re.search(r"\bcm", line)]
        assert labels, (cls, lines)
        for line in labels:
            shown = re.search(r"\bcm[\w…-]*", line).group(0)
            assert "…" in shown and len(shown) <= 16, (cls, line)
            head, tail = shown.split("…")
            assert LONG_ID.startswith(head) and LONG_ID.endswith(tail), (cls, line)
            if cls is not StepView:  # a label column: the id ends before the column does
                assert line.index(shown) + len(shown) < 9, (cls, line)


# --- every number in the queues has a label -----------------------------------------------------


def test_every_number_in_the_queues_has_a_label(trace_events):
    """A request's line reads `out 8/12`, `prompt 39`, `⟲ preempted 1×`, `hit 72`, `n=3`:
    never a bare `8/12` or `41+3`."""
    labelled = re.compile(r"(out|prompt|prefill|hit|n=|preempted) ?\d+(/\d+)?×?")
    state, seen = VizState(), 0
    for event in trace_events:
        state = reduce(state, event)
        if not isinstance(event, StepSummary):
            continue
        for line in rendered(QueuesView, state, 40, 40):
            if re.match(r"\S \S+ ", line):  # a request's line: letter, id, details
                detail = line.split(maxsplit=2)[2] if len(line.split()) > 2 else ""
                assert not re.search(r"\d", labelled.sub("", detail)), line
                seen += 1
    assert seen > 50


# --- switching scenario says what to watch ------------------------------------------------------


class NoEngine(EngineDriver):
    """The live driver's commands, no model: `setup` loads nothing."""

    def setup(self) -> None:
        pass

    def pull(self) -> bool:
        return False


def test_switching_scenario_says_what_to_watch():
    async def go() -> None:
        app = VizApp(lambda publish, notify: NoEngine(publish, notify=notify, paused=True))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.status is not None and not app.status.loading)
            await pilot.press("3")  # the third scenario
            scenario = list(SCENARIOS.values())[2]
            await wait_until(
                pilot,
                lambda: any(scenario.what_to_watch in n.message for n in app._notifications),
            )

    asyncio.run(go())
