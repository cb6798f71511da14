"""Block tables: each running request's logical blocks mapped to physical block ids.

A request being admitted is listed from the first block the scheduler gives it, before the
step schedules it (`admitting`): the block that leaves the head of the free queue lands in its
table at once.

Read a line left to right as logical block 0, 1, 2 ...: the number is the physical block that
holds those tokens in the KV cache (see the grid). A block marked `²` (or more) is shared with
other requests through the prefix cache. The gauge at the end shows how full the request's last
block is: the empty slots are the only memory paged attention wastes (internal fragmentation).
A block the latest move gave the request is drawn in white. The selected request is always
listed, even when the others do not all fit.

A model with several KV cache groups (`EngineStarted.kv_cache_groups`: sliding-window layers
beside full ones) gives each request one table per group, one under the other, tagged `full` or
`win32` (a 32-token window). In a sliding group's table the blocks the window passed read `∅`,
the null block: they went back to the free queue while the request ran.

When the tables do not all fit the panel (100x30 gives it four rows, 80x24 five), they are drawn
shorter, so that every running request keeps its tables in view, every group's: first one line
a table, its middle blocks counted (`0 …5 29 33 41`: five left out) and a run of null blocks as
one (`∅×6`); then, tighter, every request on a line of its own, its groups side by side
(`full` first, `|` between); then requests side by side (`A[0 …5 41|∅×6 41]`), keeping
fewer blocks of each table, the newest last, until they fit (at the last, the counts
left out too: `A[…41|…41]`). Only when not even one block of
each fits are requests left out (`… N more`), the selected one always shown.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.geometry import Size

from nanovllm.events import KVCacheGroupInfo
from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import RUNNING, VizState, last_block_fill, latest_changes, table_holders
from nanovllm.viz.style import DIM, FLASH, SELECTED, request_label, superscript, text_style
from nanovllm.viz.widgets.base import StateView

LABEL = 9
NULL = "∅"  # the null block in a sliding group's table


def group_tag(group: KVCacheGroupInfo) -> str:
    """`full` or `win32` (a 32-token sliding window), for a model with several groups."""
    return "full" if group.sliding_window is None else f"win{group.sliding_window}"


class BlockTablesView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.requests, state.running, state.blocks, state.draft)

    def _request_lines(self, rid: str, width: int, changed: frozenset[int]) -> list[Text]:
        state = self.state
        info = state.requests.get(rid)
        if info is None:
            return []
        bs = state.block_size
        gauge_width = max(0, min(bs, 16, width - LABEL - 12))
        fill = last_block_fill(state, info)
        gauge = Text(" ")
        full = round(fill / bs * gauge_width) if bs else 0
        gauge.append("▮" * full, text_style(info.slot))
        gauge.append("▯" * (gauge_width - full), DIM)
        gauge.append(f" {fill}/{bs}", DIM)
        if info.status != RUNNING:
            gauge.append(" admitting", "bold")
        groups = state.engine.kv_cache_groups if state.engine is not None else ()
        tags = [group_tag(g) for g in groups] if len(groups) > 1 else [""]
        tables = info.block_tables + ((),) * (len(tags) - len(info.block_tables))
        lines: list[Text] = []
        for group, (tag, table) in enumerate(zip(tags, tables)):
            if group == 0:
                line = request_label(info, rid, width=LABEL)
                if rid == self.selected:
                    line.stylize(SELECTED, 0, LABEL)
            else:
                line = Text(" " * LABEL)
            if tag:
                line.append(tag + " ", DIM)
            line = self._table(lines, line, self._cells(info, table, changed), width)
            if group == 0:
                if len(line) + len(gauge) > width:
                    lines.append(line)
                    line = Text(" " * (LABEL + len(tag) + bool(tag) + 1))
                line.append(gauge)
            lines.append(line)
        return lines

    def _cells(self, info, table: tuple[int, ...], changed: frozenset[int]) -> list[Text]:
        state = self.state
        cells = []
        for block_id in table:
            if block_id == state.null_block:
                cells.append(Text(NULL, DIM))  # a block the window passed: none held
                continue
            refs = state.blocks[block_id].ref_count if block_id < state.num_blocks else 1
            style = FLASH if block_id in changed else text_style(info.slot)
            cell = Text(f"{block_id}", style)
            if refs > 1:
                cell.append(superscript(refs), "bold")
            cells.append(cell)
        return cells

    @staticmethod
    def _table(lines: list[Text], line: Text, cells: list[Text], width: int) -> Text:
        """`[cells]` after `line`, wrapped under its `[` (full lines into `lines`); the last
        line, still open."""
        line.append("[")
        start = len(line)
        for cell in cells:
            if len(line) + len(cell) + 1 > width - 1 and len(line) > start:
                lines.append(line)
                line = Text(" " * start)
            line.append(cell)
            line.append(" ")
        if cells:
            line.right_crop(1)
        line.append("]")
        return line

    def _short_lines(
        self, rid: str, keep: int, side_by_side: bool, changed: frozenset[int]
    ) -> list[Text]:
        """The request's tables, each cut to `keep` blocks (`short_table`): one line a group,
        or (`side_by_side`) one line with its groups side by side."""
        info = self.state.requests.get(rid)
        if info is None:
            return []
        groups = self.state.engine.kv_cache_groups if self.state.engine is not None else ()
        tags = [group_tag(g) for g in groups] if len(groups) > 1 else [""]
        tables = info.block_tables + ((),) * (len(tags) - len(info.block_tables))
        shown = [short_table(self._cells(info, t, changed), t, self.state.null_block, keep)
                 for t in tables]  # fmt: skip
        label = request_label(info, rid, width=LABEL)
        if rid == self.selected:
            label.stylize(SELECTED, 0, LABEL)
        if side_by_side:
            return [bracketed(label, join_groups(shown))]
        lines = []
        for group, (tag, cells) in enumerate(zip(tags, shown)):
            line = label if group == 0 else Text(" " * LABEL)
            if tag:
                line.append(tag + " ", DIM)
            lines.append(bracketed(line, cells))
        return lines

    def _dense_lines(
        self, holders: list[str], width: int, keep: int, counted: bool, changed: frozenset[int]
    ) -> list[Text]:
        """Requests side by side, `A[tables]`, as many a line as fit (`counted`: with the
        number of blocks each table leaves out)."""
        lines, line = [], Text()
        for rid in holders:
            info = self.state.requests.get(rid)
            if info is None:
                continue
            tables = info.block_tables or ((),)
            null = self.state.null_block
            shown = [short_table(self._cells(info, t, changed), t, null, keep, counted)
                     for t in tables]  # fmt: skip
            glyph = request_label(info, rid)[:1]
            if rid == self.selected:
                glyph.stylize(SELECTED)
            token = bracketed(glyph, join_groups(shown))
            if len(line) and len(line) + 1 + len(token) > width:
                lines.append(line)
                line = Text()
            if len(line):
                line.append(" ")
            line.append(token)
        if len(line):
            lines.append(line)
        return lines

    def _all_lines(self, holders: list[str], width: int, height: int) -> list[Text]:
        """Every holder's tables, as long as fits `height` (see the module docstring)."""
        changed = latest_changes(self.state).blocks
        per_request = {rid: self._request_lines(rid, width, changed) for rid in holders}
        if sum(len(v) for v in per_request.values()) <= height:
            return [line for rid in holders for line in per_request[rid]]
        longest = max((len(t) for r in holders for t in self._tables(r)), default=1)
        keeps = sorted({k for k in (longest, 8, 6, 4, 3, 2, 1) if k <= longest}, reverse=True)
        for side_by_side in (False, True):
            for keep in keeps:
                short = [line for r in holders
                         for line in self._short_lines(r, keep, side_by_side, changed)]  # fmt: skip
                if len(short) <= height and all(len(line) <= width for line in short):
                    return short
        for keep, counted in ((4, True), (3, True), (2, True), (1, True), (1, False)):
            dense = self._dense_lines(holders, width, keep, counted, changed)
            if len(dense) <= height and all(len(line) <= width for line in dense):
                return dense
        # Not even one block of each fits: whole requests, the selected one first, counted.
        order = list(holders)
        if self.selected in per_request:
            order.remove(self.selected)
            order.insert(0, self.selected)
        return fit_requests([per_request[rid] for rid in order], height)

    def _tables(self, rid: str) -> tuple[tuple[int, ...], ...]:
        info = self.state.requests.get(rid)
        return info.block_tables if info is not None else ()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        holders = table_holders(self.state)
        if width < 1 or not holders:
            return 1
        # The full tables' rows: where the panel sizes itself, its max-height cuts them.
        changed = latest_changes(self.state).blocks
        return sum(len(self._request_lines(r, width, changed)) for r in holders)

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        if width < 1 or height < 1:
            return Text()
        holders = table_holders(state)
        if not holders:
            return Text("no running request", DIM)
        return Text("\n").join(self._all_lines(list(holders), width, height)[:height])


def fit_requests(per_request: list[list[Text]], height: int) -> list[Text]:
    """Whole requests, in order, then `… N more` counting every request not shown whole.

    A request is either drawn whole or counted, never both: the last line is kept for the count
    whenever some request does not fit. Only when not even the first fits is it shown cut
    (and counted as shown), so the panel shows at least part of one request.
    """
    total = sum(len(lines) for lines in per_request)
    if total <= height:
        return [line for lines in per_request for line in lines]
    out: list[Text] = []
    shown = 0
    for request_lines in per_request:
        if len(out) + len(request_lines) > height - 1:
            break
        out.extend(request_lines)
        shown += 1
    if shown == 0:  # part of the first, counted as shown (unless not even a line of it fits)
        out = per_request[0][: height - 1]
        shown = 1 if out else 0
    out.append(Text(f"… {len(per_request) - shown} more", DIM))
    return out[:height]


def short_table(
    cells: list[Text], table: tuple[int, ...], null: int | None, keep: int, counted: bool = True
) -> list[Text]:
    """`cells` (one a block of `table`) with each run of null blocks as one `∅×n`, then cut to
    `keep` of those: the first, `…n` for the n blocks left out (`…` alone, not `counted`), and
    the newest."""
    runs: list[tuple[Text, int]] = []  # (its cell, the blocks it stands for)
    i = 0
    while i < len(table):
        j = i
        while j < len(table) and null is not None and table[j] == null:
            j += 1
        if j - i > 1:
            runs.append((Text(f"{NULL}×{j - i}", DIM), j - i))
            i = j
        else:
            runs.append((cells[i], 1))
            i += 1
    if len(runs) <= keep + counted:  # (a count in place of one block saves nothing)
        return [cell for cell, _ in runs]
    head = 1 if keep > 1 else 0
    tail = keep - head
    left_out = sum(n for _, n in runs[head : len(runs) - tail])
    mark = Text(f"…{left_out}" if counted else "…", DIM)
    return [*(c for c, _ in runs[:head]), mark, *(c for c, _ in runs[len(runs) - tail :])]


def join_groups(groups: list[list[Text]]) -> list[Text]:
    """Every group's cells in one list, `|` between groups."""
    out: list[Text] = []
    for i, cells in enumerate(groups):
        if i:
            out.append(Text("|", DIM))
        out.extend(cells)
    return out


def bracketed(line: Text, cells: list[Text]) -> Text:
    """`line[cell cell ...]` (no space around a group's `|`, nor after a bare `…`)."""
    line.append("[")
    for i, cell in enumerate(cells):
        if i and cell.plain != "|" and cells[i - 1].plain not in ("|", "…"):
            line.append(" ")
        line.append(cell)
    line.append("]")
    return line
