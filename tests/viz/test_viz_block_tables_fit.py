"""The block tables panel at the small sizes: every running request's tables, every group's.

At 100x30 the panel has 30 columns and four rows, at 80x24 (under the queues) 24 and five:
the tables are drawn shorter until they fit (`widgets/block_tables.py`).
Without a screen, from the events alone: a state of `n` running requests, each with its blocks
in a full group and, for a hybrid model, the last of them in a sliding group (the null block
before them), drawn at the panel's size. The oracle is the state's tables: each request's
letter is drawn, each of its tables' newest block is drawn, and a table cut short counts what
it leaves out (`short_table`: the ids drawn, the `…n` and the `∅×n` add up to its length).
"""

from __future__ import annotations

import re

from budget import examples
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from rich.text import Text
from test_viz_polish import rendered, running_requests

from nanovllm.events import (
    EngineStarted,
    KVCacheGroupInfo,
)
from nanovllm.viz.state import VizState, table_holders
from nanovllm.viz.widgets.block_tables import NULL, BlockTablesView, short_table

# The panel's content area (columns, rows) at the sizes the issue names (screenshots).
PANEL_100x30 = (30, 4)
PANEL_80x24 = (24, 5)  # under the queues (app.tcss `#tables-left`: at most 7 rows, borders in)
GROUPS = (
    KVCacheGroupInfo("full", None, (1, 3)),
    KVCacheGroupInfo("sliding", 8, (0, 2)),
)


def running(n: int, blocks_each: int, hybrid: bool, window_blocks: int = 2) -> VizState:
    """`n` requests, each with `blocks_each` blocks in the full group and (`hybrid`) its last
    `window_blocks` in the sliding group, null before them; block 0 is the null block."""
    num_blocks = 1 + n * (blocks_each + window_blocks) + 4
    started = EngineStarted(
        "m", num_blocks, 4, 64, 512, 4096, True, True, "torch",
        kv_cache_groups=GROUPS if hybrid else (), null_block=0 if hybrid else None,
    )  # fmt: skip
    return running_requests(n, blocks_each, num_blocks, started, window_blocks * hybrid)


def strip(cell: str) -> str:
    """A drawn block id, less its sharing mark (`3²`) and a bare `…` before it (`…41`)."""
    return re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁺]|^…", "", cell)


@settings(max_examples=examples(40), deadline=None)
@example(n=4, blocks_each=10, hybrid=True, size=PANEL_100x30)  # the hybrid scenario's step 30
@example(n=7, blocks_each=2, hybrid=False, size=PANEL_100x30)  # the steady one's step 12
@given(
    n=st.integers(1, 8),
    blocks_each=st.integers(1, 30),
    hybrid=st.booleans(),
    size=st.sampled_from([PANEL_100x30, PANEL_80x24]),
)
def test_every_running_request_shows_every_groups_newest_block(n, blocks_each, hybrid, size):
    """Up to eight requests, block ids of two digits (the scenarios' pools have 48-64 blocks;
    eight hybrid requests with ids of three digits do not fit 24 columns by five rows)."""
    assume(n * (blocks_each + 2 * hybrid) < 99)
    state = running(n, blocks_each, hybrid)
    width, height = size
    lines = rendered(BlockTablesView, state, width, height)
    text = "\n".join(lines)
    assert len(lines) <= height and all(len(line) <= width for line in lines), lines
    assert "more" not in text, lines  # nobody left out
    drawn = {strip(w) for w in re.split(r"[\s\[\]|]+", text)}
    for rid in table_holders(state):
        info = state.requests[rid]
        letter = rendered_letter(state, rid)
        assert re.search(rf"(^|[ \n]){letter}[\[ ]", text), (rid, lines)
        for table in info.block_tables:
            assert str(table[-1]) in drawn, (rid, table, lines)


def rendered_letter(state: VizState, rid: str) -> str:
    from nanovllm.viz.style import request_label

    return request_label(state.requests[rid], rid).plain[0]


@settings(max_examples=examples(60), deadline=None)
@given(
    table=st.lists(st.integers(0, 40), min_size=0, max_size=40),
    keep=st.integers(1, 8),
)
def test_a_short_table_counts_what_it_leaves_out(table: list[int], keep: int):
    null = 0
    cells = [Text(NULL if b == null else str(b)) for b in table]
    shown = [c.plain for c in short_table(cells, tuple(table), null, keep)]
    counted = 0
    for cell in shown:
        if m := re.fullmatch(rf"…(\d+)|{NULL}×(\d+)", cell):
            counted += int(m.group(1) or m.group(2))
        else:
            counted += 1
    assert counted == len(table)
    marks = sum(1 for c in shown if c.startswith("…"))
    # `keep` cells and the count, or (a count would stand for one block) keep + 1 cells.
    assert marks <= 1 and len(shown) <= keep + 1 and (marks == 0 or len(shown) - 1 == keep)
    if table:  # the newest block is always drawn
        last = shown[-1]
        assert last == str(table[-1]) or (table[-1] == null and last.startswith(NULL)), shown
