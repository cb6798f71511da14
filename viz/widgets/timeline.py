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
from nanovllm.viz.state import VizState
from nanovllm.viz.style import CELL_CHARS, DIM, SELECTED, cell_style, request_label, runs
from nanovllm.viz.widgets.base import StateView

LABEL = 9  # width of the row labels
BLANK = Style()


def timeline_rows(state: VizState, rows: list[str], selected: str | None, room: int) -> list[str]:
    """The `room` rows to draw out of `rows` (in arrival order), kept in that order.

    When they do not all fit, the running requests come first (the batch is what a column
    shows), then the selected one, then the waiting ones (front of the queue first), then the
    finished ones, newest first: a long waiting queue never pushes the batch off the screen.
    """
    if len(rows) <= room:
        return rows
    running = set(state.running)
    front = {rid: i for i, rid in enumerate(state.waiting)}
    position = {rid: i for i, rid in enumerate(rows)}

    def rank(rid: str) -> tuple[int, int]:
        if rid in running:
            return (0, position[rid])
        if rid == selected:
            return (1, 0)
        if rid in front:
            return (2, front[rid])
        return (3, -position[rid])

    kept = set(sorted(rows, key=rank)[:room])
    return [rid for rid in rows if rid in kept]


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
        arrived = sorted(order, key=lambda r: order[r])
        rows = timeline_rows(state, arrived, self.selected, max(0, height - 1))
        lines = [self._ruler(columns)]
        for rid in rows:
            info = state.requests.get(rid)
            line = request_label(info, rid, width=LABEL)
            line.append(" ")
            index = info.slot if info else 0
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
