"""Batch timeline: a row per request, a column per engine step.

Cells: `P` prefill (the prompt's last piece, which samples a token), `p` a prefill chunk, `=`
decode, `≡` a decode that also verified proposed tokens (speculative decoding), `X` preempted,
`·` waiting. Reading down a column gives one step's batch; reading along a
row gives one request's life. Continuous batching shows as new rows starting in the very step
after another row ends.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import RUNNING, WAITING, VizState
from nanovllm.viz.style import CELL_CHARS, DIM, SELECTED, cell_style, request_label, runs
from nanovllm.viz.widgets.base import StateView

LABEL = 9  # width of the row labels
BLANK = Style()


class TimelineView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.timeline,)

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        room = max(1, width - LABEL - 1)
        columns = state.timeline[-room:]
        if not columns:
            return Text("no steps yet", DIM)
        # Rows: every request seen in the visible steps, in order of arrival.
        order: dict[str, int] = {}
        for column in columns:
            for rid in column.cells:
                if rid not in order:
                    info = state.requests.get(rid)
                    order[rid] = info.index if info else -1
        rows = sorted(order, key=lambda r: order[r])
        lines_left = max(0, height - 1)
        if len(rows) > lines_left:
            # Keep the live requests and the selected one; drop the oldest finished ones.
            def keep(rid: str) -> bool:
                info = state.requests.get(rid)
                live = info is not None and info.status in (RUNNING, WAITING)
                return live or rid == self.selected

            drop = len(rows) - lines_left
            kept = []
            for rid in rows:
                if drop > 0 and not keep(rid):
                    drop -= 1
                    continue
                kept.append(rid)
            rows = kept[-lines_left:] if lines_left else []
            if self.selected in kept and self.selected not in rows and rows:
                rows = [r for r in rows[1:]] + [self.selected]  # never hide the selection
                rows.sort(key=lambda r: order[r])
        lines = [self._ruler(columns)]
        for rid in rows:
            info = state.requests.get(rid)
            line = request_label(info, rid, width=LABEL)
            line.append(" ")
            index = info.index if info else 0
            cells = []
            for column in columns:
                kind = column.cells.get(rid)
                if kind is None:
                    cells.append((" ", BLANK))
                else:
                    cells.append((CELL_CHARS[kind], cell_style(kind, index)))
            line.append(runs(cells))
            if rid == self.selected:
                line.stylize(SELECTED, 0, LABEL)
            lines.append(line)
        return Text("\n").join(lines)

    def _ruler(self, columns: tuple) -> Text:
        """`step` and a tick with the step number every 10 steps."""
        ruler = Text("step".ljust(LABEL + 1), DIM)
        marks = [" "] * len(columns)
        for i, column in enumerate(columns):
            if column.step % 10 == 0:
                label = str(column.step)
                if i + len(label) <= len(marks):
                    marks[i : i + len(label)] = list(label)
        ruler.append("".join(marks), DIM)
        return ruler
