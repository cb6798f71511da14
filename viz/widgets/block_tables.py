"""Block tables: each running request's logical blocks mapped to physical block ids.

Read a line left to right as logical block 0, 1, 2 ...: the number is the physical block that
holds those tokens in the KV cache (see the grid). A block marked `²` (or more) is shared with
other requests through the prefix cache. The gauge at the end shows how full the request's last
block is: the empty slots are the only memory paged attention wastes (internal fragmentation).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import VizState, last_block_fill
from nanovllm.viz.style import DIM, SELECTED, request_label, superscript, text_style
from nanovllm.viz.widgets.base import StateView

LABEL = 9


class BlockTablesView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.requests, state.running, state.blocks)

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        if not state.running:
            return Text("no running request", DIM)
        bs = state.block_size
        gauge_width = min(bs, 16)
        lines: list[Text] = []
        for n, rid in enumerate(state.running):
            info = state.requests.get(rid)
            if info is None:
                continue
            fill = last_block_fill(state, info)
            gauge = Text(" ")
            full = round(fill / bs * gauge_width) if bs else 0
            gauge.append("▮" * full, text_style(info.index))
            gauge.append("▯" * (gauge_width - full), DIM)
            gauge.append(f" {fill}/{bs}", DIM)
            cells = []
            for block_id in info.block_table:
                refs = state.blocks[block_id].ref_count if block_id < state.num_blocks else 1
                cell = Text(f"{block_id}", text_style(info.index))
                if refs > 1:
                    cell.append(superscript(refs), "bold")
                cells.append(cell)
            # Wrap the ids under the label; the gauge goes on the last line.
            line = request_label(info, rid, width=LABEL)
            if rid == self.selected:
                line.stylize(SELECTED, 0, LABEL)
            line.append("[")
            start = len(line)
            request_lines = []
            for cell in cells:
                if len(line) + len(cell) + 1 > width - 1 and len(line) > start:
                    request_lines.append(line)
                    line = Text(" " * start)
                line.append(cell)
                line.append(" ")
            if cells:
                line.right_crop(1)
            line.append("]")
            if len(line) + len(gauge) > width:
                request_lines.append(line)
                line = Text(" " * start)
            line.append(gauge)
            request_lines.append(line)
            if len(lines) + len(request_lines) > height:
                remaining = len(state.running) - n
                if lines and remaining:
                    lines[-1] = Text(f"… {remaining} more running", DIM)
                break
            lines.extend(request_lines)
        return Text("\n").join(lines[:height])
