"""The views' choices, checked against invariants of the reduced state (issue 31, defects 2,
3, 5, 7 and 8): what the block tables list, which timeline rows survive a long queue, how the
paging diagram lays a block out and counts its slots, which letters requests get, how much of
its width the KV grid uses, and that every scenario shows block tables and paging at 100x30.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from viz_helpers import wait_until

from nanovllm.events import BlockAllocated, EngineStarted, RequestAdded, RequestFinished
from nanovllm.viz.scenarios import MAX_WAITING, SCENARIOS
from nanovllm.viz.state import (
    FINISHED,
    NUM_SLOTS,
    VizState,
    block_fill,
    reduce,
    reduce_all,
    table_holders,
)
from nanovllm.viz.style import GLYPHS, request_glyph
from nanovllm.viz.widgets.block_tables import BlockTablesView
from nanovllm.viz.widgets.kv_cache import ROW_LABEL, grid_shape
from nanovllm.viz.widgets.paging import MIN_SLOT, PagingView, slot_layout
from nanovllm.viz.widgets.timeline import timeline_rows


@pytest.fixture(scope="module")
def trace_states(trace_events) -> list[VizState]:
    """The state after each event of the committed trace."""
    states, state = [], VizState()
    for event in trace_events:
        state = reduce(state, event)
        states.append(state)
    return states


# --- defect 3: a block taken for a request lands in its table at once --------------------------


def test_every_block_given_is_in_a_listed_block_table(trace_events, trace_states):
    """Right after each `BlockAllocated`, the block tables list that request with that block,
    whether the request runs already or is being admitted in this step."""
    admitting = 0
    for event, state in zip(trace_events, trace_states):
        if not isinstance(event, BlockAllocated) or event.request_id not in state.requests:
            continue
        assert event.request_id in table_holders(state), event
        assert event.block_id in state.requests[event.request_id].block_table
        admitting += event.request_id not in state.running
    assert admitting > 10  # the trace admits requests: the case the tables used to miss
    for state in trace_states:  # and nobody else: the running, and who holds blocks
        for rid in table_holders(state):
            assert rid in state.running or state.requests[rid].block_table, rid


def test_block_tables_view_draws_a_request_being_admitted(trace_events, trace_states):
    i = next(i for i, e in enumerate(trace_events) if isinstance(e, BlockAllocated))
    state, event = trace_states[i], trace_events[i]
    assert event.request_id not in state.running  # the step has not scheduled it yet
    view = BlockTablesView()
    view.state = state
    text = "\n".join(line.plain for line in view._request_lines(event.request_id, 60, frozenset()))
    assert event.request_id in text and f"[{event.block_id}]" in text and "admitting" in text


# --- defect 7: paging rows divide the block; both views count a block's slots alike ---------------


@given(block_size=st.integers(1, 64), width=st.integers(1, 300))
def test_paging_rows_divide_the_block(block_size: int, width: int):
    per_line, slot = slot_layout(block_size, width)
    assert block_size % per_line == 0  # 16 as 16 or 8 + 8, never 15 + 1
    assert per_line * slot <= max(width, per_line)
    if width >= MIN_SLOT:
        assert slot >= MIN_SLOT
    # As many slots a line as fit: the next divisor up would not.
    bigger = [n for n in range(per_line + 1, block_size + 1) if block_size % n == 0]
    assert not bigger or bigger[0] * MIN_SLOT > width


def test_block_tables_and_paging_count_the_same_slots(trace_states):
    """The last block's fill: `n/16` in the block tables, `n/16 slots` in the paging diagram."""
    tables, paging = BlockTablesView(), PagingView()
    checked = 0
    for state in trace_states[::3]:
        bs = state.block_size
        for rid in table_holders(state):
            info = state.requests[rid]
            if not info.block_table:  # its blocks just went back (preempted, finishing)
                continue
            last = len(info.block_table) - 1
            n = block_fill(state, info, last)
            tables.state = paging.state = state
            gauge = tables._request_lines(rid, 80, frozenset())[-1].plain
            assert f" {n}/{bs}" in gauge, (rid, gauge)
            rows = paging._block_rows(info, last, info.block_table[last], 10, bs, 3)
            assert f"· {n}/{bs} slots" in rows[-1].plain, (rid, rows[-1].plain)
            checked += 1
    assert checked > 50


# --- defect 5: the batch stays in the timeline; the queue stays bounded ---------------------------


@given(
    kinds=st.lists(st.sampled_from("rwf"), min_size=1, max_size=40),
    room=st.integers(0, 30),
    data=st.data(),
)
def test_timeline_keeps_the_running_requests(kinds: list[str], room: int, data):
    rows = [f"r{i}" for i in range(len(kinds))]
    running = tuple(r for r, k in zip(rows, kinds) if k == "r")
    waiting = tuple(data.draw(st.permutations([r for r, k in zip(rows, kinds) if k == "w"])))
    selected = data.draw(st.one_of(st.none(), st.sampled_from(rows)))
    state = VizState(running=running, waiting=waiting)
    shown = timeline_rows(state, rows, selected, room)
    assert len(shown) == min(room, len(rows))
    assert shown == [r for r in rows if r in shown]  # arrival order kept
    if len(running) <= room:
        assert set(running) <= set(shown)  # a long queue never pushes the batch out
        if selected is not None and len(running) < room:
            assert selected in shown
    else:
        assert set(shown) <= set(running)
    # Waiting requests come in queue order: the front before the back.
    kept_waiting = [r for r in waiting if r in shown]
    assert kept_waiting == list(waiting[: len(kept_waiting)]) or selected in waiting


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "burst"])
def test_waiting_queue_stays_bounded(name: str):
    """A slow engine (one request served every 12 ticks, one at a time) against each
    scenario's arrivals: the queue stops growing at `MAX_WAITING` plus one tick's arrivals."""
    workload = SCENARIOS[name].workload(seed=1)
    queue: list[int] = []
    longest = 0
    for tick in range(600):
        queue += [tick] * len(workload.arrivals(tick, busy=bool(queue), waiting=len(queue)))
        if tick % 12 == 0 and queue:
            queue.pop(0)
        longest = max(longest, len(queue))
    first_tick = len(SCENARIOS[name].workload(seed=1).arrivals(0, busy=False))
    assert longest <= max(first_tick, MAX_WAITING) + 1, longest


# --- defect 8: letters do not repeat on screen; the KV grid uses its width ----------------------


def engine_started(num_blocks: int = 8) -> EngineStarted:
    return EngineStarted("m", num_blocks, 4, 8, 64, 64, True, True, "torch")


@settings(max_examples=examples(30))
@given(seed=st.integers(0, 10**6), n=st.integers(30, 120))
def test_live_requests_have_distinct_letters(seed: int, n: int):
    """Requests arrive and finish at random: as long as at most `NUM_SLOTS` live at once, no
    two live requests share a letter (the 27th request used to be `A` again)."""
    rng = random.Random(seed)
    state = reduce(VizState(), engine_started())
    live: list[str] = []
    for i in range(n):
        rid = f"r{i}"
        state = reduce(state, RequestAdded(rid, "x", 1, 4, ("x",)))
        live.append(rid)
        while len(live) > NUM_SLOTS - 1 or (live and rng.random() < 0.3):
            done = live.pop(rng.randrange(len(live)))
            state = reduce(state, RequestFinished(1, done, "length", 1, 0))
        letters = [request_glyph(state.requests[r].slot) for r in live]
        assert len(set(letters)) == len(letters), letters
    assert len(GLYPHS) == NUM_SLOTS
    assert all(state.requests[r].status != FINISHED for r in live)


def test_letters_of_a_long_queue_do_not_repeat():
    """Thirty waiting requests (more than the 26 Latin letters) get thirty letters."""
    events = [engine_started()] + [RequestAdded(f"r{i}", "x", 1, 4, ("x",)) for i in range(30)]
    state = reduce_all(VizState(), events)
    letters = {request_glyph(info.slot) for info in state.requests.values()}
    assert len(letters) == 30


@given(num_blocks=st.integers(16, 512), width=st.integers(40, 200), height=st.integers(3, 60))
def test_kv_grid_uses_most_of_its_width(num_blocks: int, width: int, height: int):
    """A grid with more blocks than fit in one row uses at least 3/4 of its width (a 47-column
    panel used to draw 8 blocks of 3 characters: half of it)."""
    cell, _, cols, rows = grid_shape(num_blocks, width, height, big=True)
    if rows > 1:
        assert cols * cell >= 0.75 * (width - ROW_LABEL) - cell, (cell, cols)


def test_big_kv_cells_show_the_whole_hash():
    cell, lines, cols, _ = grid_shape(48, 150, 40, big=True)
    assert lines == 3 and cell - 2 >= len("#a09bfa83d121")


# --- defect 2: block tables and paging at 100x30, in every scenario -----------------------------


def test_every_scenario_shows_block_tables_and_paging_at_100x30(tiny_llama: Path):
    """One live app on the tiny model, switched through the scenarios with `1`-`9`, `0` (all but
    `chunked` and `offload`, whose prompts the tiny model's byte-level tokenizer makes too long
    for their KV caches; `test_viz_tier.py` runs `offload` on the embedded model; and `disagg`,
    whose two engines have a layout of their own, `test_viz_disagg.py`): after a few
    steps each
    one draws its block tables (a request and its blocks) and the paging
    diagram (a logical -> physical row) at 100x30."""
    from nanovllm.viz.app import VizApp, screen_text
    from nanovllm.viz.driver import EngineDriver

    def make(publish, notify):
        return EngineDriver(
            publish,
            notify=notify,
            scenario="steady",
            overrides=dict(model=str(tiny_llama), num_threads=1),
            speed=0,
            max_steps=4,
        )

    async def go():
        app = VizApp(make)
        async with app.run_test(size=(100, 30)) as pilot:
            for key, name in enumerate(SCENARIOS, 1):
                if name in ("chunked", "offload", "disagg"):
                    continue  # see the docstring
                if key > 1:  # the app starts on the first one
                    await pilot.press(str(key % 10))  # (`0`: the tenth)
                    await wait_until(
                        pilot,
                        lambda name=name: (
                            app.status.scenario == name
                            and not app.status.loading
                            and app.state.step == 0
                        ),
                        timeout=120,
                    )
                    await pilot.press("space")  # paused at --steps: play on to step 4
                try:
                    await wait_until(
                        pilot, lambda: app.state.step >= 4 and app.status.paused, timeout=120
                    )
                except AssertionError:
                    raise AssertionError((name, app.state.step, app.status)) from None
                await pilot.pause(0.2)
                text = screen_text(app)
                assert "Block tables" in text and "Paging" in text, name
                tables = app.query_one("#tables-center", BlockTablesView)
                paging = app.query_one("#paging-center", PagingView)
                assert tables.region.height >= 6 and paging.region.height >= 6, name
                rid = app.state.running[0]
                assert rid in text and " → #" in text, name

    asyncio.run(go())


# --- beyond: the contiguous reservation beside the paged cache ---------------------------------


def test_contiguous_reservation_wastes_at_least_what_paging_does(trace_states):
    """Paging allocates at most `max_model_len` slots a request, by blocks, and shares
    prefixes, so a contiguous reservation of `max_model_len` slots per running request is
    never less empty than the paged cache, and never holds more requests than fit. Checked
    after each step of the trace."""
    from nanovllm.viz.state import contiguous_figures, kv_figures

    checked = 0
    for state in trace_states:
        if not state.running or state.engine is None or state.draft.events:
            continue  # at step boundaries: mid-step, blocks are held by who is being admitted
        paged, contiguous = kv_figures(state), contiguous_figures(state)
        assert contiguous.num_reserved_slots == len(state.running) * state.engine.max_model_len
        assert contiguous.num_reserved_slots >= paged.num_allocated_slots
        assert contiguous.fragmentation >= paged.fragmentation - 1e-9
        capacity = state.num_blocks * state.block_size
        assert contiguous.num_fit * state.engine.max_model_len <= capacity
        checked += 1
    assert checked > 30
