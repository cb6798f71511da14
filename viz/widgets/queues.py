"""Queues: waiting, running and finished requests.

A preemption shows as a request leaving RUNNING for the *front* of WAITING (marked with how
many times it was preempted). A child of parallel sampling (`1_p`: child 1 of request `p`) is
marked with the size of its family, `n=3`. Click a request, or use the arrow keys, to select it.

A waiting request says why it waits, as the scheduler said at the last step (`waiting.py`):
`⧗seqs` max_num_seqs requests already run, `⧗block` no free KV block for the head's tokens,
`⧗budget` the token budget is spent, `⧗preempt` a preemption this step admits nobody, `⧗new`
arrived after the last step (the paging diagram says it in words for the selected request).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.message import Message

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import VizState, family_of
from nanovllm.viz.style import DIM, HEADING, SELECTED, fit, request_label
from nanovllm.viz.waiting import why_waiting
from nanovllm.viz.widgets.base import StateView


class QueuesView(StateView):
    class Selected(Message):
        """The user clicked a request."""

        def __init__(self, request_id: str) -> None:
            super().__init__()
            self.request_id = request_id

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rows: list[str | None] = []  # request id drawn on each line, for clicks

    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.requests, state.waiting, state.running, state.finished, state.families,
                state.waiting_reason, state.waiting_head)  # fmt: skip

    def sections(self) -> list[tuple[str, list[str]]]:
        state = self.state
        return [
            ("WAITING", list(state.waiting)),
            ("RUNNING", list(state.running)),
            ("FINISHED", list(reversed(state.finished))),
        ]

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        sections = self.sections()
        # Share the lines among the sections: shrink the longest until everything fits.
        shown = [len(ids) for _, ids in sections]
        room = max(0, height - len(sections))
        while sum(shown) > room and any(shown):
            i = max(range(len(shown)), key=lambda k: shown[k])
            shown[i] -= 1
        lines: list[Text] = []
        self._rows = []
        for (title, ids), n in zip(sections, shown):
            lines.append(Text(f"{title} {len(ids)}", HEADING))  # the count: labelled by the title
            self._rows.append(None)
            visible = ids[:n]
            if len(ids) > n and n > 0:
                visible = ids[: n - 1]
            for rid in visible:
                lines.append(self._line(rid, width))
                self._rows.append(rid)
            if len(visible) < len(ids) and n > 0:
                lines.append(Text(f"  … {len(ids) - len(visible)} more", DIM))
                self._rows.append(None)
        return Text("\n").join(lines[:height])

    def _line(self, rid: str, width: int) -> Text:
        info = self.state.requests.get(rid)
        line = request_label(info, rid, width=9)
        if info is not None:
            # Every number with its label: `out 12/39` (output tokens of at most), `prompt 46`.
            if info.status == "finished":
                detail = f"out {info.num_output_tokens}/{info.max_tokens} · {info.finish_reason}"
            elif info.status == "waiting":
                detail = f"prompt {info.num_prompt_tokens}"
                if info.num_output_tokens:  # preempted: its output so far is recomputed too
                    detail += f" · out {info.num_output_tokens}"
                if info.num_preemptions:  # first: what a narrow panel keeps
                    detail = f"⟲ preempted {info.num_preemptions}× · {detail}"
                why = why_waiting(self.state, rid)  # the scheduler's reason, in short: first
                if why:
                    detail = f"⧗{why[0]} · {detail}"
            else:
                detail = f"out {info.num_output_tokens}/{info.max_tokens}"
                if info.num_computed_tokens < info.num_prompt_tokens:
                    detail = f"prefill {info.num_computed_tokens}/{info.num_prompt_tokens}"
                if info.num_cached_tokens:
                    detail += f" · hit {info.num_cached_tokens}"
            family = family_of(self.state, rid)
            if family is not None:
                detail += f" · n={len(family[1])}"
            line.append(" ")
            line.append(fit(Text(detail, DIM), max(0, width - len(line))))
        line.truncate(width, pad=True)
        if rid == self.selected:
            line.stylize(SELECTED)
        return line

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)  # None on the border
        if offset is not None and 0 <= offset.y < len(self._rows):
            request_id = self._rows[offset.y]
            if request_id is not None:
                self.post_message(self.Selected(request_id))
