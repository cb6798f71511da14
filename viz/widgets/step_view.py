"""Step composition: a step's tokens by request, prefill vs decode, against the token budget.

The bar is the step's token budget (`max_num_batched_tokens`), each request's share drawn in
its colour with its letter, in proportion to its tokens: upper case for prompt tokens (prefill
or a chunk of one), lower case for decode tokens; `·` is budget left unused. A decode costs one
token (without speculation), so a step full of decodes barely dents the budget while one long
prefill can fill it: that is why a long prompt is cut into chunks. A request whose share is less than a cell
draws nothing and the line under the bar says so.

With speculative decoding a decode computes its own token plus the k proposed tokens it
verifies (`decode 1+k` under the bar, then how many were accepted once the step has verified
them): speculation spends spare budget to gain several tokens in one step.

While a step plays event by event this shows the step in progress (requests join it as the
scheduler picks them); otherwise the last step done.
"""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import CHUNK, DECODE, PREFILL, VizState, latest_changes, shown_step
from nanovllm.viz.style import DIM, FLASH, HEADING, fit, owner_style, request_glyph, request_label
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.words import count

KIND_NAMES = {PREFILL: "prefill", CHUNK: "chunk", DECODE: "decode"}


def segment_widths(tokens: list[int], budget: int, width: int) -> list[int]:
    """Cells per request in proportion to its tokens, at most the tokens' share of `width`.

    A request whose share is under half a cell gets none (0): it is too small to draw, and
    giving a cell to whichever one a running total happens to round up on would single out an
    arbitrary request among equals (twelve one-token decodes in a 512-token budget). The others
    end at the rounded running total of their own tokens, so no rounding error piles up.
    """
    if not tokens or width <= 0:
        return [0] * len(tokens)
    scale = width / max(budget, sum(tokens), 1)
    widths, total, edge = [], 0, 0
    for t in tokens:
        if t * scale < 0.5:
            widths.append(0)
            continue
        total += t
        end = math.floor(total * scale + 0.5)  # half up, not Python's half to even
        widths.append(end - edge)
        edge = end
    return widths


class StepView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.last_step, state.draft)

    def render(self) -> Text:
        state = self.state
        record = shown_step(state)
        width, height = self.size.width, self.size.height
        if width < 3 or height < 1:
            return Text()
        if record is None:
            return Text("waiting for the first step", DIM)
        summary = record.summary
        budget = (summary.token_budget if summary else 0) or (
            state.engine.max_num_batched_tokens if state.engine else 0
        )
        used = record.num_tokens
        prefill = sum(s.num_tokens for s in record.scheduled if s.kind != DECODE)
        decode = used - prefill
        proposed = sum(s.num_proposed for s in record.scheduled)
        playing = summary is None
        head = Text(f"step {record.step}{' so far' if playing else ''}: ", HEADING)
        share = f" ({used / budget:.0%})" if budget else ""
        head.append(f"{used} of {count(budget, 'token')}{share}, ")
        head.append(f"{count(len(record.scheduled), 'request')} · ")
        head.append(f"prefill {prefill} + decode {decode}")
        if proposed:
            head.append(f" ({proposed} proposed)")
        head = fit(head, width)
        lines = [head]

        changed = latest_changes(state).requests if playing else frozenset()
        bar = Text()
        infos = [state.requests.get(s.request_id) for s in record.scheduled]
        verified = {rid: accepted for rid, _, accepted in record.verified}
        widths = segment_widths([s.num_tokens for s in record.scheduled], budget, width - 2)
        for s, info, w in zip(record.scheduled, infos, widths):
            index = info.slot if info else 0
            glyph = request_glyph(index)
            char = glyph.lower() if s.kind == DECODE else glyph
            style = FLASH if s.request_id in changed else owner_style(index)
            bar.append(char * w, style)
        hidden = sum(1 for w in widths if w == 0)
        if hidden:  # too small for a cell: say so instead of drawing them bigger than they are
            what = "request" if hidden == 1 else "requests"
            room = width - 2 - sum(widths)
            notes = (
                f" +{hidden} {what} under a cell "
                if hidden < len(widths)
                else (f" {hidden} {what}, each under a cell "),
                f" +{hidden} more ",
                f" +{hidden}",
            )
            bar.append(next((n for n in notes if len(n) <= room), ""), DIM)
        bar.append("·" * max(0, width - 2 - len(bar)), DIM)
        lines.append(Text("▕") + bar + Text("▏"))

        # One item per request; items never break across lines; what does not fit is counted.
        room = max(0, height - 2)
        item_lines: list[Text] = [Text()]
        shown = 0
        for n, (s, info) in enumerate(zip(record.scheduled, infos)):
            item = request_label(info, s.request_id)
            if s.num_proposed:
                item.append(f" decode 1+{s.num_proposed}", DIM)
                if s.request_id in verified:
                    item.append(f", {verified[s.request_id]} accepted", DIM)
            else:
                item.append(f" {KIND_NAMES[s.kind]} {s.num_tokens}", DIM)
            if s.kind != DECODE and s.num_computed_tokens:
                item.append(f" (from {s.num_computed_tokens})", DIM)
            rest = len(record.scheduled) - n
            more = len(f"  … {rest} more")
            line = item_lines[-1]
            last_line = len(item_lines) == room
            if line and len(line) + 2 + len(item) + (more if last_line and rest > 1 else 0) > width:
                if last_line:
                    break
                item_lines.append(line := Text())
            if line:
                line.append("  ")
            line.append(item)
            shown += 1
        if shown < len(record.scheduled) and room:
            item_lines[-1].append(f"  … {len(record.scheduled) - shown} more", DIM)
        lines.extend(item_lines[:room])
        return Text("\n").join(lines[:height])
