"""The executor panel's heat row, without a screen: the probe's event in, lines of text out.

The numbers' oracle is the event itself (the engine's are checked against transformers in
tests/test_attention_probe.py): every block shows its own tokens, running max and running sum,
the columns line up from one line to the next, the blocks left out are counted, the shades
order the weights (the largest `█`, none lighter than a smaller weight's). Then the app: the
panel asks the driver for the probe while it is open, `h` cycles the heads, and a trace
without a probe says why the row is missing.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.events import AttentionComputed, AttentionProbed, StepInputsPrepared
from nanovllm.executor.online_softmax import online_softmax_walk
from nanovllm.viz.attention_heat import SCORE_BARS, WEIGHT_SHADES, next_layer, why_none
from nanovllm.viz.state import VizState, reduce
from nanovllm.viz.widgets.attention_heat import LABEL, attention_heat, heat_lines

# Tiny tensors: torch single-threaded (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def probe_event(
    seq_len: int, block_size: int, heads: int = 4, kv_heads: int = 2, seed: int = 0, step: int = 3
) -> AttentionProbed:
    g = torch.Generator().manual_seed(seed)
    q, keys = torch.randn(heads, 8, generator=g) * 2, torch.randn(seq_len, kv_heads, 8, generator=g)
    walk = online_softmax_walk(q, keys, block_size, 8**-0.5)
    blocks = tuple(range(100, 100 + -(-seq_len // block_size)))

    def rows(t):
        return tuple(tuple(r) for r in t.tolist())

    return AttentionProbed(
        step, "r1", 0, block_size, seq_len, blocks, 8**-0.5, kv_heads,
        rows(walk.scores), rows(walk.running_max), rows(walk.running_sum), rows(walk.weights),
    )  # fmt: skip


def cells(line: str) -> list[str]:
    """A heat line's block columns: what stands between its `│`s (the label and markers off)."""
    parts = line[LABEL:].split("│")[1:]
    if parts:
        parts[-1] = re.sub(
            r" +\d+ more▸.*$|  (layers\.\d+ ·  )?top .*$|  layers\.\d+$", "", parts[-1]
        )
    return [p.rstrip() for p in parts]


def hidden(line: str) -> int:
    before = re.search(r"◂(\d+) ", line)
    after = re.search(r" (\d+) more▸", line)
    return (int(before.group(1)) if before else 0) + (int(after.group(1)) if after else 0)


@settings(max_examples=examples(20), deadline=None)
@given(
    block_size=st.integers(1, 16),
    seq_len=st.integers(1, 80),
    width=st.integers(40, 160),
    room=st.integers(1, 8),
    head=st.integers(0, 9),
    seed=st.integers(0, 1000),
)
def test_the_heat_row_shows_the_events_walk(block_size, seq_len, width, room, head, seed):
    probe = probe_event(seq_len, block_size, seed=seed)
    state = reduce(VizState(), probe)
    assert state.attention_probe is probe
    lines = [
        t.plain for t in attention_heat(state.attention_probe, "r1", 3, "live", head, width, room)
    ]
    assert 1 <= len(lines) <= min(room, 6)
    assert all(len(line) <= width for line in lines)
    h = head % 4
    size, num_blocks = block_size, len(probe.block_table)
    rows = {line[:LABEL].strip(): line for line in lines if not line.startswith("inside")}
    assert "weights" in rows
    if len(lines) >= 2:
        assert f"h{h}/4 q·k" in rows
    # The same blocks on every line, each at the same column, the rest counted.
    bars = [[m.start() for m in re.finditer("│", line)] for line in rows.values()]
    assert all(b == bars[0] for b in bars)
    first_line = next(iter(rows.values()))
    shown = len(bars[0])
    assert shown >= 1 and shown + hidden(first_line) == num_blocks
    first = int(re.search(r"◂(\d+) ", first_line).group(1)) if "◂" in first_line else 0
    blocks = range(first, first + shown)  # logical blocks: their tokens, from the event
    tokens = [range(i * size, min((i + 1) * size, seq_len)) for i in blocks]
    weights = probe.weights[h]
    largest = max(weights)
    assert weights.index(largest) // size in blocks  # the largest weight is on screen
    for toks, shades in zip(tokens, cells(rows["weights"])):
        assert len(shades) == len(toks)  # a cell a token
        for t, shade in zip(toks, shades):
            assert (shade == "█") == (weights[t] >= largest / 2)
            assert (shade == "·") == (weights[t] < largest / 128)
            for t2, shade2 in zip(toks, shades):  # never lighter for a larger weight
                if weights[t] > weights[t2]:
                    assert WEIGHT_SHADES.index(shade) >= WEIGHT_SHADES.index(shade2)
    if "max" in rows or "max sum" in rows:
        if "max sum" in rows:
            pairs = [cell.split() for cell in cells(rows["max sum"])]
        else:
            pairs = list(zip(cells(rows["max"]), cells(rows["sum"])))
        for i, (m, s) in zip(blocks, pairs):
            for text, value in ((m, probe.running_max[h][i]), (s, probe.running_sum[h][i])):
                decimals = len(text.split(".")[1]) if "." in text else 0
                assert abs(float(text) - value) <= 0.5 * 10**-decimals + 1e-9
    if f"h{h}/4 q·k" in rows:
        scores = probe.scores[h]
        for toks, bars_ in zip(tokens, cells(rows[f"h{h}/4 q·k"])):
            assert len(bars_) == len(toks)
            for t, bar in zip(toks, bars_):
                if scores[t] == max(scores) and max(scores) > min(scores):
                    assert bar == SCORE_BARS[-1]
                if scores[t] == min(scores) and max(scores) > min(scores):
                    assert bar == SCORE_BARS[0]
                for t2, bar2 in zip(toks, bars_):  # never lower for a larger score
                    if scores[t] > scores[t2]:
                        assert SCORE_BARS.index(bar) >= SCORE_BARS.index(bar2)
    if "layer 0" in rows:
        assert cells(rows["layer 0"]) == [f"#{probe.block_table[i]}" for i in blocks]


def test_the_walk_replays_block_by_block_during_the_attention_stage():
    """While the attention cursor is on block k: blocks after it are blank, and the weights
    wait for the last block; the window follows the cursor, counting what it leaves out."""
    probe = probe_event(seq_len=40, block_size=4)  # 10 blocks, 5 columns each
    scores, m, s, weights = (t.plain for t in heat_lines(probe, 0, 80, 4, reading=7))
    assert "once attention has read the last block" in weights
    assert [bool(c) for c in cells(scores)] == [True] * 8 + [False] * 2
    assert [bool(c) for c in cells(m)] == [bool(c) for c in cells(s)] == [True] * 8 + [False] * 2
    # Narrower: the window ends at the block being read, the blocks on either side counted.
    scores = heat_lines(probe, 0, 60, 4, reading=7)[0].plain
    assert scores.startswith("h0/4 q·k  ◂1 │") and scores.endswith("│█▄▆▆ 2 more▸")
    assert len(cells(scores)) == 7  # blocks 1 to 7
    done = [t.plain for t in heat_lines(probe, 0, 80, 4, reading=9)]  # the last block
    assert "once attention" not in done[-1] and "█" in done[-1]


def test_why_the_row_is_missing():
    probe = probe_event(seq_len=5, block_size=4)
    trace = why_none(None, "r1", 3, "replay")
    assert "this trace has no attention probe" in trace
    assert "not in this trace for r2 at step 3" in why_none(probe, "r2", 3, "replay")
    assert "captured for r1, not r2" in why_none(probe, "r2", 3, "live")
    assert "from the next step" in why_none(probe, "r1", 4, "live")
    assert "server" in why_none(None, "r1", 3, "connect")
    lines = attention_heat(None, "r1", 3, "replay", 0, 80, 2)
    assert [t.plain for t in lines] == [
        "attention inside: this trace has no attention probe: it is recorded only while",
        "the executor panel is open in a live run",
    ]
    one = attention_heat(None, "r1", 3, "replay", 0, 60, 1)[0].plain
    assert len(one) <= 60 and one.endswith(" …")  # cut between words, marked
    assert attention_heat(probe, "r1", 3, "live", 0, 80, 2, attention_ran=False)[0].plain == (
        "attention inside: step 3 has not reached its attention stage yet"
    )
    assert attention_heat(probe, "r1", 3, "live", 0, 80, 0) == []


# --- in the app -----------------------------------------------------------------------------------


def with_probe(events: list, step: int) -> tuple[list, AttentionProbed]:
    """The trace with a probe event for step `step`'s first request, where the engine puts it
    (just before `AttentionComputed`), shaped like its context."""
    inputs = next(e for e in events if isinstance(e, StepInputsPrepared) and e.step == step)
    seq_len, size = inputs.seq_lens[0], inputs.block_size
    probe = probe_event(seq_len, size, step=step)
    probe = replace(probe, request_id=inputs.request_ids[0], block_table=inputs.block_tables[0])
    i = next(i for i, e in enumerate(events) if isinstance(e, AttentionComputed) and e.step == step)
    return events[:i] + [probe] + events[i:], probe


def test_the_panel_asks_for_the_probe_and_h_cycles_heads(trace_events):
    from viz_helpers import wait_until

    from nanovllm.viz.app import VizApp, screen_text
    from nanovllm.viz.driver import ProbeAttention, ReplayDriver

    step = 3
    events, probe = with_probe(trace_events, step)
    sent: list = []

    def make(publish, notify):
        driver = ReplayDriver(events, publish, notify=notify, paused=False, speed=0, max_steps=step)
        real = driver.send
        driver.send = lambda command: sent.append(command) or real(command)
        return driver

    async def drive() -> tuple[str, str, bool | None]:
        app = VizApp(make, panel="executor")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.step >= step)
            app.select(probe.request_id)
            await pilot.pause(0.1)
            first = screen_text(app)
            await pilot.press("h")
            await pilot.pause(0.1)
            second = screen_text(app)
            footer = screen_text(app).splitlines()[-1]
            await pilot.press("l")  # the next layer: asked of the engine
            await pilot.pause(0.1)
            await pilot.press("x")  # the panel closes: the probe is off
            await pilot.pause(0.1)
            keys = app.check_action("next_head", ()), app.check_action("next_layer", ())
            return first, second, footer, keys

    first, second, footer, keys = asyncio.run(drive())
    assert "h0/4 q·k" in first and "h1/4 q·k" in second
    assert " l layer " in footer + " "
    probes = [c for c in sent if isinstance(c, ProbeAttention)]
    assert probes[-3:] == [
        ProbeAttention(probe.request_id), ProbeAttention(probe.request_id, 1), ProbeAttention(None)
    ]  # fmt: skip
    assert keys == (False, False)  # the head and layer keys leave the footer with the panel


def test_the_layer_key_cycles_the_layers_as_vllm_numbers_them():
    assert [next_layer(i, 3) for i in range(3)] == [1, 2, 0]
    assert next_layer(0, 0) == 0  # before the first step says how many layers there are


@settings(max_examples=examples(20), deadline=None)
@given(layer=st.integers(0, 40), room=st.integers(1, 6))
def test_the_heat_row_names_the_probed_layer(layer: int, room: int):
    """Whatever its room, the heat row says which layer its numbers are from: the title and the
    ids row (`layer N`), or else the weights' line after them (`layers.N`, vLLM's name)."""
    lines = [
        line.plain for line in heat_lines(replace(probe_event(20, 4), layer=layer), 0, 120, room)
    ]
    named = [line for line in lines if f"layer {layer}" in line or f"layers.{layer}" in line]
    assert named, lines


def test_a_trace_without_the_probe_says_so(trace_events):
    from viz_helpers import wait_until

    from nanovllm.viz.app import VizApp, screen_text
    from nanovllm.viz.driver import ReplayDriver

    async def drive() -> str:
        app = VizApp(
            lambda publish, notify: ReplayDriver(
                trace_events, publish, notify=notify, paused=False, speed=0, max_steps=3
            ),
            panel="executor",
        )
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.step >= 3)
            await pilot.pause(0.1)
            return screen_text(app)

    assert "this trace has no attention probe" in asyncio.run(drive())


def test_the_engine_driver_keeps_the_probe_across_engines():
    """`ProbeAttention` reaches the engine, and a new engine (another scenario) gets it again;
    a replay takes it silently (the panel says why it has no numbers)."""
    from nanovllm.viz.driver import EngineDriver, ProbeAttention, ReplayDriver

    class Engine:
        def __init__(self) -> None:
            self.asked: list = []

        def probe_attention(self, request_id, layer=0) -> None:
            self.asked.append((request_id, layer))

    notes: list = []
    driver = EngineDriver(lambda s, st: None, notify=lambda m, s: notes.append(m))
    driver.engine = Engine()
    driver._handle_common(ProbeAttention("r2"))
    assert driver.engine.asked == [("r2", 0)]
    again = driver.engine = Engine()  # what `setup` does with a new engine:
    driver.probe(driver._probe)
    assert again.asked == [("r2", 0)]
    replay = ReplayDriver([], lambda s, st: None, notify=lambda m, s: notes.append(m))
    replay._handle_common(ProbeAttention("r2"))
    assert notes == []


def test_a_live_engine_probes_the_request_the_panel_asks_for(tiny_llama: Path):
    """Through the driver to a real engine and back as events: while asked, each step that runs
    the request carries its probe, shaped like its context in the executor's own inputs, from
    the layer asked; once stopped, none."""
    from nanovllm.viz.driver import EngineDriver, ProbeAttention
    from nanovllm.viz.executor import request_spans

    driver = EngineDriver(
        lambda s, st: None, scenario="steady", overrides=dict(model=str(tiny_llama), num_threads=1)
    )
    driver.setup()
    try:
        driver._handle_common(ProbeAttention("r1"))
        for _ in range(3):
            driver.pull()
        driver.tape.to_end()
        state = driver.tape.state
        probe, span = state.attention_probe, request_spans(state.executor.inputs)[0]
        assert probe is not None and probe.step == state.step and probe.request_id == "r1"
        assert (span.request_id, span.seq_len, span.block_table) == (
            "r1", probe.seq_len, probe.block_table
        )  # fmt: skip
        driver._handle_common(ProbeAttention("r1", 1))  # the `l` key: the next layer
        driver.pull()
        driver.tape.to_end()
        second = driver.tape.state.attention_probe
        assert (second.layer, second.request_id, second.step) == (1, "r1", probe.step + 1)
        driver._handle_common(ProbeAttention(None))
        driver.pull()
        driver.tape.to_end()
        assert driver.tape.state.attention_probe is second  # no new one
    finally:
        driver.close()
