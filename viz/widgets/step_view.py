"""Step composition: the last step's tokens by request, prefill vs decode, against the budget.

The bar is the step's token budget (`max_num_batched_tokens`): each request's share is drawn in
its colour with its letter, upper case for prompt tokens (prefill or a chunk of one), lower case
for a decode token; `·` is budget left unused. Decodes cost one token each, so a step full of
decodes barely dents the budget while one long prefill can fill it: that is why a long prompt is
cut into chunks.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import CHUNK, DECODE, PREFILL, VizState
from nanovllm.viz.style import DIM, HEADING, owner_style, request_glyph, request_label
from nanovllm.viz.widgets.base import StateView

KIND_NAMES = {PREFILL: "prefill", CHUNK: "chunk", DECODE: "decode"}


def segment_widths(tokens: list[int], budget: int, width: int) -> list[int]:
    """Cells per request: proportional to tokens, at least one each, never over `width`."""
    if not tokens or width <= 0:
        return [0] * len(tokens)
    scale = width / max(budget, sum(tokens), 1)
    widths = [max(1, round(t * scale)) for t in tokens]
    while sum(widths) > width and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    return widths


class StepView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.last_step,)

    def render(self) -> Text:
        state, record = self.state, self.state.last_step
        width, height = self.size.width, self.size.height
        if record is None or record.summary is None:
            return Text("waiting for the first step", DIM)
        summary = record.summary
        budget = summary.token_budget or (
            state.engine.max_num_batched_tokens if state.engine else 0
        )
        used = record.num_tokens
        head = Text(f"step {record.step}: ", HEADING)
        share = f" ({used / budget:.0%})" if budget else ""
        head.append(f"{used} of {budget} tokens{share}, {len(record.scheduled)} requests · ")
        head.append(f"prefill {summary.num_prefill_tokens} + decode {summary.num_decode_tokens}")
        lines = [head]

        bar = Text()
        infos = [state.requests.get(s.request_id) for s in record.scheduled]
        widths = segment_widths([s.num_tokens for s in record.scheduled], budget, width - 2)
        for s, info, w in zip(record.scheduled, infos, widths):
            index = info.index if info else 0
            glyph = request_glyph(index)
            char = glyph.lower() if s.kind == DECODE else glyph
            bar.append(char * w, owner_style(index))
        bar.append("·" * max(0, width - 2 - sum(widths)), DIM)
        lines.append(Text("▕") + bar + Text("▏"))

        # One item per request; items never break across lines.
        item_lines: list[Text] = [Text()]
        for s, info in zip(record.scheduled, infos):
            item = request_label(info, s.request_id)
            item.append(f" {KIND_NAMES[s.kind]} {s.num_tokens}", DIM)
            if s.kind != DECODE and s.num_computed_tokens:
                item.append(f" (from {s.num_computed_tokens})", DIM)
            line = item_lines[-1]
            if line and len(line) + 2 + len(item) > width:
                item_lines.append(line := Text())
            if line:
                line.append("  ")
            line.append(item)
        lines.extend(item_lines[: max(0, height - 3)])
        events = []
        if record.admitted:
            events.append("admitted " + " ".join(record.admitted))
        if record.preempted:
            events.append("preempted " + " ".join(record.preempted))
        if record.finished:
            events.append("finished " + " ".join(record.finished))
        if events and height > 2:
            lines = lines[: height - 1] + [Text(" · ".join(events), "italic")]
        return Text("\n").join(lines[:height])
