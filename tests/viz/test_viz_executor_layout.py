"""The executor panel at every size (issue 53): every kind of fact shows, nothing is cut inside
a word, and nothing is left out without a marker that counts it.

The oracle is the step's own `StepInputsPrepared`, drawn at random (block size 1-16, up to 12
requests, prefill chunks, block ids of up to three digits, long contexts): the panel, drawn at
sizes from the smallest it gets (48x11: 80x24 gives it 48 columns, the narrowest) to big ones, is parsed back and compared
with it. `wrap_items`, the cut every list of the panel goes through, is checked alone too.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from textual.geometry import Size

from nanovllm.events import RequestAdded, StepInputsPrepared, TokensSampled
from nanovllm.viz.executor import block_reads, slot_label
from nanovllm.viz.executor_layout import more, plan_lines, wrap_items
from nanovllm.viz.state import VizState, reduce
from nanovllm.viz.widgets.executor import ExecutorView

CUT = re.compile(r"[^\W_]…")  # `decod…`: a word cut short
READ = re.compile(r"L(\d+)→#(\d+)\[(\d+)\]")
SIZES = st.sampled_from([(48, 11), (48, 13), (64, 14), (62, 19), (84, 22), (60, 30)]) | st.tuples(
    st.integers(48, 140), st.integers(11, 40)
)


@st.composite
def steps(draw):
    """A step's flat inputs and the state that holds them, its sampled tokens included."""
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    n = draw(st.integers(1, 12))
    events: list = []
    sampled: list = []
    rows, ids, positions, slots, starts, seq_lens, tables, logits = [], [], [], [], [0], [], [], []
    words = draw(st.lists(st.text("ab ␣\nxyzé", max_size=12), min_size=1, max_size=8))
    for i in range(n):
        query = draw(st.integers(1, 40))
        seq_len = query + draw(st.integers(0, 300))
        base = draw(st.integers(0, 999))  # block ids of one to three digits, scattered
        table = tuple((base + 37 * k) % 1000 for k in range(-(-seq_len // block_size)))
        texts = tuple(words[(i + k) % len(words)] for k in range(seq_len))
        events.append(RequestAdded(f"r{i}", None, seq_len, 16, texts))
        for pos in range(seq_len - query, seq_len):
            rows.append(len(rows))
            ids.append((base * 31 + pos * 17) % 50_000)
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(len(rows))
        seq_lens.append(seq_len)
        tables.append(table)
        if draw(st.booleans()) or i == 0:  # the others may be chunks: no logits row
            logits.append(len(rows) - 1)
            sampled.append(
                (f"r{i}", tuple(draw(st.lists(st.integers(0, 50_000), min_size=1, max_size=5))))
            )
    inputs = StepInputsPrepared(
        1, block_size, tuple(f"r{i}" for i in range(n)), tuple(ids), tuple(positions),
        tuple(slots), tuple(starts), tuple(seq_lens), tuple(tables), tuple(logits), len(logits),
    )  # fmt: skip
    state = VizState()
    for event in [*events, inputs, TokensSampled(1, *zip(*sampled))]:
        state = reduce(state, event)
    selected = f"r{draw(st.integers(0, n - 1))}"
    return state, inputs, selected


def panel(state: VizState, selected: str, width: int, height: int) -> list[str]:
    """The panel's lines at `width` x `height`, as its `render` draws them."""

    class Sized(ExecutorView):
        @property
        def size(self) -> Size:  # type: ignore[override]
            return Size(width, height)

    view = Sized()
    view.state, view.selected = state, selected
    return view.render().plain.split("\n")


@settings(max_examples=examples(40), deadline=None)
@given(steps(), SIZES)
def test_no_line_is_cut_inside_a_word(step, size):
    """D1: every line fits the panel as built, so nothing ends in a word cut short (`t…`)."""
    state, _inputs, selected = step
    lines = panel(state, selected, *size)
    assert len(lines) <= size[1]
    for line in lines:
        assert cell_len(line) <= size[0], line
        assert not CUT.search(line), line


@settings(max_examples=examples(40), deadline=None)
@given(steps(), SIZES)
def test_every_block_read_is_shown_or_counted(step, size):
    """D2: the selected request's block reads, in order; those left out are counted."""
    state, inputs, selected = step
    lines = panel(state, selected, *size)
    i = inputs.request_ids.index(selected)
    span_reads = block_reads(
        SimpleNamespace(block_table=inputs.block_tables[i], seq_len=inputs.seq_lens[i]),
        inputs.block_size,
    )
    start = next(k for k, line in enumerate(lines) if line.startswith(("attention ", "attn ")))
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    text = " ".join(lines[start:end])
    shown = [tuple(map(int, m)) for m in READ.findall(text)]
    assert shown == span_reads[: len(shown)]
    left = re.search(r"… (\d+) more blocks?$", text)
    assert len(shown) + (int(left[1]) if left else 0) == len(span_reads), text


@settings(max_examples=examples(40), deadline=None)
@given(steps(), SIZES)
def test_every_input_of_the_selected_request_shows(step, size):
    """D3: at every size, the six flat inputs of the selected request (its first token's id,
    position and slot in the batch's columns; its query start, context length and block
    table), and every request listed or counted."""
    state, inputs, selected = step
    width, height = size
    lines = panel(state, selected, width, height)
    rows = {line.split()[0].lstrip("◂"): line for line in lines[2:8]}
    assert list(rows) == ["row", "token", "id", "pos", "slot", "logits"], lines
    i = inputs.request_ids.index(selected)
    first = inputs.query_start_loc[i]
    # The columns: consecutive rows from the first shown, the selected request's first among
    # them; the ones after counted (`+5▸`), the ones before in the title (`rows 3-7`).
    shown = [int(r) for r in re.findall(r"(\d+) \S", rows["row"][7:].split("+")[0])]
    assert shown == list(range(shown[0], shown[0] + len(shown))) and first in shown
    after = re.search(r"\+(\d+)▸", rows["row"])
    assert shown[-1] + 1 + (int(after[1]) if after else 0) == len(inputs.input_ids)
    if len(shown) < len(inputs.input_ids):
        assert f"rows {shown[0]}-{shown[-1]}" in lines[1]
    column = shown.index(first)
    for name, value in (
        ("id", str(inputs.input_ids[first])),
        ("pos", str(inputs.positions[first])),
        ("slot", slot_label(inputs.slot_mapping[first], inputs.block_size)),
    ):
        assert rows[name][7:].split()[column] == value, (name, lines)
    # The request's line: query start, tokens, context length, its block table or its start.
    head = (
        f"{selected} q@{first} ×{inputs.query_start_loc[i + 1] - first} ctx {inputs.seq_lens[i]} ["
    )
    line = next((line for line in lines if head in line), None)
    assert line is not None, (head, size, "\n".join(lines))
    table = line.split(head)[1].split("]")[0]
    listed = [int(b) for b in table.split("…")[0].split()]
    counted = re.search(r"… (\d+) more$", table)
    assert listed == list(inputs.block_tables[i][: len(listed)])
    assert len(listed) + (int(counted[1]) if counted else 0) == len(inputs.block_tables[i])
    # Every request listed, or counted.
    listed_requests = [line for line in lines if re.match(r"\S r\d+ q@\d+ ×", line)]
    left = next(
        (re.search(r"… (\d+) more requests?", x) for x in lines if "more request" in x), None
    )
    assert len(listed_requests) + (int(left[1]) if left else 0) == len(inputs.request_ids)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.text("abL0→#[]1", min_size=1, max_size=14), max_size=40),
    st.integers(8, 120),
    st.integers(1, 5),
    st.integers(0, 30),
)
def test_wrap_items_cuts_between_items_and_counts_the_rest(items, width, max_lines, first):
    """Each line holds whole items in order within `width`; the items left out are counted."""
    wrapped = wrap_items(items, width, max_lines, " ⇢ ", more("block"), first=first)
    order = [i for line in wrapped.lines for i in line]
    assert order == list(range(len(order))) and len(wrapped.lines) <= max_lines
    left = len(items) - len(order)
    assert wrapped.marker == (more("block")(left) if left else "")
    for n, line in enumerate(wrapped.lines):
        used = (first if n == 0 else 2) + cell_len(" ⇢ ".join(items[i] for i in line))
        if n == len(wrapped.lines) - 1 and wrapped.marker:
            used += (1 if line else 0) + cell_len(wrapped.marker)
        # (a heading wider than `width` is the caller's; so is a marker that fits no line)
        assert used <= width or not line, (line, used)


@settings(max_examples=examples(30), deadline=None)
@given(steps(), SIZES)
def test_paging_reaches_every_token_of_the_batch(step, size):
    """`]` pages through the flat batch: from the first page, every row comes on screen, in
    order, each page starting where the last ended; `[` shows the columns before a page."""
    state, inputs, _selected = step
    width, height = size

    class Sized(ExecutorView):
        @property
        def size(self) -> Size:  # type: ignore[override]
            return Size(width, height)

    view = Sized()
    view.state, view.selected = state, inputs.request_ids[0]

    def rows_shown() -> list[int]:
        row = view.render().plain.split("\n")[2]
        return [int(r) for r in re.findall(r"(\d+) \S", row[7:].split("+")[0])]

    pages = [rows_shown()]
    while pages[-1][-1] < len(inputs.input_ids) - 1:
        view.page(1)
        pages.append(rows_shown())
        assert pages[-1][0] == pages[-2][-1] + 1 or pages[-1][-1] == len(inputs.input_ids) - 1
        assert len(pages) <= len(inputs.input_ids)
    assert sorted(set(sum(pages, []))) == list(range(len(inputs.input_ids)))
    if len(pages) > 1:
        view.page(-1)  # back: the columns right before the last page, from further left
        back = rows_shown()
        # (Filled from its start, a page may reach into the next when widths differ.)
        assert back[0] < pages[-1][0] and pages[-1][0] - 1 in back, (back, pages)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(13, 40), st.integers(1, 12), st.integers(1, 6), st.integers(0, 5))
def test_the_logits_line_and_the_heat_rows_weights_always_have_a_line(
    height, num_requests, attention_lines, heat_lines
):
    """From the 13 lines the panel has at 80x24 up: the logits line (the logits' shape, said
    nowhere else) and the heat row's weights are never dropped to make room for more reads,
    which are counted when cut (`… 9 more blocks`)."""
    plan = plan_lines(height, num_requests, attention_lines, heat_lines)
    assert plan.logits
    assert plan.heat >= min(1, heat_lines)
    assert plan.attention >= 1 and plan.requests >= 1
