"""The model executor: one step's flat inputs, one column a token, and the step's stages.

The scheduler decides who runs; the executor turns that into one flat batch with no padding
and no batch dimension (`nanovllm/executor/step_inputs.py`). Each column is one token of it:

    req    the request it belongs to (its letter)
    token  its text (or id)
    pos    its position in its request
    slot   where its K and V go in the paged cache: `block·block_size+offset`
    logits its row of logits, when it has one (✓: sampled; lp: prompt logprobs only)

Under the columns, each request: where its queries start in the flat batch, how many tokens it
computes, its context length (what its attention reads) and its block table. A prefill chunk
that stops short of its prompt's end has no logits row: it samples nothing.

Then the step plays in the engine's order, one event a stage: inputs prepared, K/V written
(the slots light up, here, in the KV grid and in the paging diagram), attention (the selected
request's queries read its context block by block through its block table: the hop from one
physical block to the next is where paging shows), logits, sampled. Every figure is the one the
engine's executor used (`StepInputsPrepared`); none is computed here.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.executor import (
    ATTENTION,
    INPUTS,
    KV,
    LOGITS,
    SAMPLED,
    STAGE_NAMES,
    STAGES,
    ExecutorStep,
    RequestSpan,
    TokenColumn,
    block_reads,
    request_spans,
    slot_label,
    token_columns,
)
from nanovllm.viz.state import VizState
from nanovllm.viz.style import DIM, FLASH, HEADING, owner_style, request_glyph, token_cell
from nanovllm.viz.waiting import budget_cut
from nanovllm.viz.widgets.base import StateView

LABELS = ("row", "req", "token", "pos", "slot", "logits")
LABEL_WIDTH = 7
HOP_SECONDS = 0.4  # the attention cursor's time on each block (only during the attention stage)
# The stages' names on a narrow panel.
SHORT_STAGE_NAMES = {
    INPUTS: "in",
    KV: "K/V",
    ATTENTION: "attn",
    LOGITS: "logits",
    SAMPLED: "sampled",
}
READING = Style(color="black", bgcolor="#e5c07b", bold=True)  # the block attention reads now


class ExecutorView(StateView):
    """The executor panel (`x` shows it in place of the batch timeline)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hop = 0  # which of the selected request's blocks attention is reading

    def on_mount(self) -> None:
        self.set_interval(HOP_SECONDS, self._next_hop)

    def _next_hop(self) -> None:
        ex = self.state.executor
        if ex is not None and ex.stage == ATTENTION and self.display and self.is_on_screen:
            self.hop += 1
            self.refresh()

    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.executor, state.requests, state.last_step)

    # --- drawing ------------------------------------------------------------------------------

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        ex = self.state.executor
        if width < 10 or height < 1:
            return Text()
        if ex is None:
            return Text("no executor step yet (a trace recorded before these events has none)", DIM)
        lines = [self._stages(ex, width)]
        columns = token_columns(ex.inputs)
        spans = request_spans(ex.inputs)
        selected = self._selected_span(spans)
        lines.extend(self._table(ex, columns, selected, width))
        # What is left goes first to the logits line, then to attention's reads (at least its
        # first line), then to the requests' list (a heading and a line at least).
        left = height - len(lines) - 1
        attention = self._attention(ex, selected, width)[: max(1, left - 2)]
        left -= len(attention)
        if left >= 2:
            lines.extend(self._requests(ex, spans, selected, width, room=left - 1))
        lines.extend(attention + self._logits(ex, width))
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return Text("\n").join(lines[:height])

    def _selected_span(self, spans: list[RequestSpan]) -> RequestSpan | None:
        for span in spans:
            if span.request_id == self.selected:
                return span
        return spans[0] if spans else None

    def _letter(self, request_id: str) -> Text:
        info = self.state.requests.get(request_id)
        if info is None:
            return Text("?", DIM)
        return Text(request_glyph(info.slot), owner_style(info.slot))

    def _stages(self, ex: ExecutorStep, width: int) -> Text:
        full = len(f"step {ex.step} ") + sum(len(n) + 2 for n in STAGE_NAMES.values())
        names = STAGE_NAMES if full <= width else SHORT_STAGE_NAMES
        head = Text(f"step {ex.step} ", HEADING)
        for stage in STAGES:
            name = names[stage]
            if stage == ex.stage:
                head.append(f"▸{name}", FLASH)
            elif ex.reached(stage):
                head.append(f"▸{name}", "bold")
            else:
                head.append(f"▸{name}", DIM)
            head.append(" ")
        return head

    def _table(
        self, ex: ExecutorStep, columns: list[TokenColumn], selected: RequestSpan | None, width: int
    ) -> list[Text]:
        bs = ex.inputs.block_size
        cell = max(len(slot_label(c.slot, bs)) for c in columns) + 1 if columns else 8
        fit = max(1, (width - LABEL_WIDTH - 2) // cell)
        # Start at the selected request's first token, so its columns are on screen.
        start = selected.query_start if selected else 0
        start = max(0, min(start, len(columns) - fit))
        shown = columns[start : start + fit]
        before, after = start, len(columns) - start - len(shown)
        title = Text(f"flat batch: {len(columns)} tokens", HEADING)
        if before or after:
            title.append(f" · rows {start}-{start + len(shown) - 1} shown", DIM)
        rows = [Text(label.ljust(LABEL_WIDTH), DIM) for label in LABELS]
        rows[0] = Text(("◂" if before else " ") + "row".ljust(LABEL_WIDTH - 1), DIM)
        reading = selected.request_id if selected and ex.stage == ATTENTION else None
        for c in shown:
            info = self.state.requests.get(c.request_id)
            rows[0].append(str(c.row).ljust(cell), DIM)
            letter = self._letter(c.request_id)
            letter.append(" " * (cell - 1))
            rows[1].append(letter)
            text = (
                info.tokens[c.position]
                if info is not None and c.position < len(info.tokens)
                else str(c.token_id)
            )
            style = READING if c.request_id == reading else ""
            rows[2].append(token_cell(text, cell - 1) + " ", style)
            rows[3].append(str(c.position).ljust(cell), style)
            written = ex.stage == KV
            rows[4].append(slot_label(c.slot, bs).ljust(cell), FLASH if written else "")
            if c.logits_row is None:
                rows[5].append("·".ljust(cell), DIM)
            else:  # ✓ sampled; lp: prompt logprobs only
                lit = ex.stage == LOGITS or (ex.stage == SAMPLED and c.sampled)
                rows[5].append(("✓" if c.sampled else "lp").ljust(cell), FLASH if lit else "bold")
        if after:
            rows[0].append(f"+{after}▸", DIM)
        return [title, *rows]

    def _requests(
        self,
        ex: ExecutorStep,
        spans: list[RequestSpan],
        selected: RequestSpan | None,
        width: int,
        room: int,
    ) -> list[Text]:
        cut = budget_cut(self.state) if self.state.last_step is not None else {}
        sampled = dict(ex.sampled)
        lines = [Text("per request: q@query start ×tokens · ctx context · block table", DIM)]
        order = spans
        if selected is not None and selected in spans[room:]:
            order = [selected] + [s for s in spans if s is not selected]
        for span in order[:room]:
            line = self._letter(span.request_id)
            line.append(f" {span.request_id} ", "bold" if span is selected else "")
            line.append(f"q@{span.query_start} ×{span.query_len} · ctx {span.seq_len} · ")
            line.append("→".join(f"#{b}" for b in span.block_table), DIM)
            if not span.samples:
                needed = cut.get(span.request_id) if ex.step == self.state.step else None
                more = f" of {needed} needed" if needed else ""
                line.append(f" · chunk{more}: the token budget cut it, no logits", "italic")
            elif span.request_id in sampled and ex.reached(SAMPLED):
                tokens = " ".join(map(str, sampled[span.request_id]))
                line.append(f" · sampled {tokens}", FLASH if ex.stage == SAMPLED else "bold")
            lines.append(line)
        if len(spans) > room:
            lines[-1] = Text(f"… {len(spans) - room + 1} more requests", DIM)
        return lines

    def _attention(self, ex: ExecutorStep, span: RequestSpan | None, width: int) -> list[Text]:
        """The selected request's context read block by block through its block table,
        `logical→#physical[tokens read]`, wrapped over at most 3 lines."""
        if span is None:
            return []
        reads = block_reads(span, ex.inputs.block_size)
        line = Text("attention ", HEADING)
        line.append(self._letter(span.request_id))
        line.append(f" {span.request_id} reads ctx {span.seq_len}: ")
        lines = [line]
        now = self.hop % len(reads) if reads and ex.stage == ATTENTION else None
        for i, (logical, block, n) in enumerate(reads):
            item = Text(f"L{logical}→#{block}[{n}]")
            item.stylize(READING if i == now else ("bold" if ex.reached(ATTENTION) else DIM))
            if i < len(reads) - 1:
                item.append(" ⇢ ", DIM)
            if len(lines[-1]) + len(item) > width and len(lines[-1]) > 2:
                if len(lines) == 3:
                    lines[-1].append(f"… {len(reads) - i} more blocks", DIM)
                    break
                lines.append(Text("  "))
            lines[-1].append(item)
        return lines

    def _logits(self, ex: ExecutorStep, width: int) -> list[Text]:
        rows = ex.inputs.logits_rows
        n = ex.inputs.num_sampled_rows
        line = Text("logits ", HEADING)
        if not rows:
            line.append("no row: no request reached the end of its prompt", DIM)
            return [line]
        vocab = f" × {ex.vocab_size}" if ex.vocab_size else ""
        line.append(f"[{len(rows)}{vocab}] of {len(ex.inputs.input_ids)} rows: ")
        line.append(" ".join(map(str, rows[:n])), FLASH if ex.stage == LOGITS else "bold")
        if len(rows) > n:
            line.append(f" + prompt logprobs {' '.join(map(str, rows[n:]))}", DIM)
        return [line]
