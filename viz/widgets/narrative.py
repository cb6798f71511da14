"""The step in words: what happened, in the engine's order (see `narrative.py`).

While a step plays event by event, its notes appear one by one and the newest is highlighted;
at a step boundary the whole step just done is listed, ending with its summary.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.narrative import (
    ARRIVE,
    CACHE,
    EVICT,
    FINISH,
    FREE,
    HIT,
    PREEMPT,
    REJECT,
    SUMMARY,
    TAKE,
)
from nanovllm.viz.state import VizState
from nanovllm.viz.style import DIM, FLASH, HEADING, text_style
from nanovllm.viz.widgets.base import StateView

MARKS = {
    ARRIVE: "+",
    REJECT: "✗",
    TAKE: "←",
    EVICT: "✕",
    HIT: "↑",
    CACHE: "#",
    FREE: "→",
    PREEMPT: "⟲",
    FINISH: "✓",
    SUMMARY: "■",
}


class NarrativeView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.draft, state.last_step)

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        if width < 1 or height < 1:
            return Text()
        playing = bool(state.draft.events)
        record = state.draft if playing else state.last_step
        if record is None or not record.notes:
            return Text("nothing has happened yet", DIM)
        title = f"step {record.step} so far" if playing else f"step {record.step}"
        notes: list[list[Text]] = []
        newest = len(record.notes) - 1
        for n, note in enumerate(record.notes):
            info = state.requests.get(note.request_id) if note.request_id else None
            line = Text(f"{MARKS.get(note.kind, '·')} ", DIM)
            line.append(note.text, text_style(info.index) if info else "")
            if playing and n == newest:
                line.stylize(FLASH)
            notes.append(list(line.wrap(self.app.console, width)))
        header = Text(title, HEADING)
        # Keep the newest notes whole: that is where the step is.
        room = height - 1
        lines: list[Text] = []
        kept = 0
        for wrapped in reversed(notes):
            need = len(wrapped) + (1 if kept < len(notes) - 1 else 0)  # + the "earlier" line
            if len(lines) + need > room and lines:
                break
            lines[:0] = wrapped[: max(1, room)]
            kept += 1
        if kept < len(notes):
            header.append(f" · {len(notes) - kept} earlier not shown", DIM)
        return Text("\n").join([header] + lines)
