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
    DECODE,
    DROP,
    EVICT,
    FETCH,
    FINISH,
    FREE,
    HIT,
    LOAD,
    LOAD_FAILED,
    LOCAL,
    PREEMPT,
    RECEIVE,
    REJECT,
    SAVE,
    SEND,
    SPEC,
    SUMMARY,
    TAKE,
    TOKENS,
)
from nanovllm.viz.state import VizState
from nanovllm.viz.style import DIM, FLASH, HEADING, fit, text_style
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
    SPEC: "»",
    SAVE: "⇣",
    DROP: "✕",
    LOAD: "⇡",
    LOAD_FAILED: "✗",
    SEND: "⇢",
    RECEIVE: "⇠",
    FETCH: "⇡",
    LOCAL: "✗",
    SUMMARY: "■",
}


ROUTINE = (DECODE, TOKENS, CACHE, SUMMARY)


def _kept(wrapped: list[tuple[int, list[Text]]], lines: list[Text]) -> list[int]:
    """The notes of `wrapped` whose first line made it into `lines`."""
    ids = {id(line) for line in lines}
    return [n for n, note_lines in wrapped if id(note_lines[0]) in ids]


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
        newest = len(record.notes) - 1
        wrapped: list[tuple[int, list[Text]]] = []
        for n, note in enumerate(record.notes):
            info = state.requests.get(note.request_id) if note.request_id else None
            line = Text(f"{MARKS.get(note.kind, '·')} ", DIM)
            line.append(note.text, text_style(info.slot) if info else "")
            if playing and n == newest:
                line.stylize(FLASH)
            wrapped.append((n, list(line.wrap(self.app.console, width))))
        header = Text(title, HEADING)
        room = height - 1
        # Too long for the panel: first leave out the routine notes (decodes, sampled tokens,
        # cached blocks, the summary), never the newest while playing; then the oldest.
        if sum(len(w) for _, w in wrapped) > room:
            keep = [
                (n, w)
                for n, w in wrapped
                if record.notes[n].kind not in ROUTINE or (playing and n == newest)
            ]
            wrapped = keep or wrapped[-1:]
        lines: list[Text] = []
        for _, note_lines in reversed(wrapped):
            if len(lines) + len(note_lines) > room and lines:
                break
            lines[:0] = note_lines[: max(1, room)]
        hidden = len(record.notes) - sum(1 for _ in _kept(wrapped, lines))
        if hidden > 0:
            header.append(f" · {hidden} more not shown", DIM)
        header = fit(header, width)
        return Text("\n").join([header] + lines)
