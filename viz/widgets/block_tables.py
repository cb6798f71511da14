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

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        holders = table_holders(self.state)
        if width < 1 or not holders:
            return 1
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
        changed = latest_changes(state).blocks
        per_request = {rid: self._request_lines(rid, width, changed) for rid in holders}
        order = list(holders)
        # When they do not all fit, the selected request goes first so it is never cut off.
        total = sum(len(v) for v in per_request.values())
        if total > height and self.selected in per_request:
            order.remove(self.selected)
            order.insert(0, self.selected)
        lines = fit_requests([per_request[rid] for rid in order], height)
        return Text("\n").join(lines[:height])


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
