"""The model executor: one step's flat inputs, one column a token, and the step's stages.

The scheduler decides who runs; the executor turns that into one flat batch with no padding
and no batch dimension (`nanovllm/executor/step_inputs.py`). Each column is one token of it:

    row    its row in the flat batch, and the request it belongs to (its letter)
    token  its text
    id     its token id: what the model's embedding reads
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

Every size shows every kind of fact: `executor_layout.py` shares the panel's lines out (one
line of each kind first) and cuts each list between two items with a marker saying what it
left out (`… 14 more blocks`); `[` and `]` page through the flat batch's columns.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
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
    group_view,
    request_spans,
    slot_label,
    token_columns,
)
from nanovllm.viz.executor_layout import (
    clamp_start,
    column_window,
    first_fitting,
    fit_list,
    more,
    page_before,
    plan_lines,
    wrap_items,
)
from nanovllm.viz.executor_text import no_step_words, sampled_words
from nanovllm.viz.state import VizState, primary_group
from nanovllm.viz.style import (
    DIM,
    FLASH,
    HEADING,
    escape_token,
    fit,
    owner_style,
    request_glyph,
    short_id,
)
from nanovllm.viz.waiting import budget_cut
from nanovllm.viz.widgets.attention_heat import attention_heat
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.widgets.block_tables import NULL
from nanovllm.viz.words import count

LABELS = ("row", "token", "id", "pos", "slot", "logits")
LABEL_WIDTH = 7
MAX_TOKEN = 16  # cells of a token's text at most (a longer one ends in `…`, the only cut)
ID_ROOM = 12  # cells of a request id in the request lines at most (`short_id`)
READS = " ⇢ "  # between two block reads
TABLE_MORE = more("")  # a block table's blocks left out, inside its brackets: `[0 1 … 5 more]`
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
        self.attention_head = 0  # the head the heat row shows (`h` cycles them)
        # The first column shown when the learner paged (`[`, `]`), for (step, selection);
        # otherwise the page starts at the selected request's first token.
        self._paged: tuple[int, str | None, int] | None = None
        self._page: tuple[list[int], int, int] = ([], 0, 0)  # widths, room, start: last drawn

    def on_mount(self) -> None:
        self.set_interval(HOP_SECONDS, self._next_hop)

    def _next_hop(self) -> None:
        ex = self.state.executor
        if ex is not None and ex.stage == ATTENTION and self.display and self.is_on_screen:
            self.hop += 1
            self.refresh()

    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.executor, state.requests, state.last_step, state.attention_probe)

    def page(self, delta: int) -> None:
        """Show the flat batch's next (`delta` 1) or previous (-1) page of columns."""
        ex = self.state.executor
        widths, room, start = self._page
        if ex is None or not widths:
            return
        if delta > 0:
            end = column_window(widths, start, room)
            start = start if end >= len(widths) else end
        else:
            start = page_before(widths, start, room)
        self._paged = (ex.step, self.selected, start)
        self.refresh()

    # --- drawing ------------------------------------------------------------------------------

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        ex = self.state.executor
        if width < 10 or height < 1:
            return Text()
        if ex is None:
            return Text(no_step_words(self.state, self.status), DIM)
        group = primary_group(self.state)  # (a hybrid model's full group: every block)
        columns = token_columns(group_view(ex.inputs, group))
        spans = request_spans(ex.inputs, group)
        selected = self._selected_span(spans)
        reads = self._reads(ex, selected, width, height)
        want_heat = len(self.heat_lines(ex, selected, width, height)) if selected else 0
        plan = plan_lines(height, len(spans), len(reads), want_heat)
        lines = [self._stages(ex, width), *self._table(ex, columns, selected, width)]
        if plan.legend:
            lines.append(self._legend(width))
        lines.extend(self._requests(ex, spans, selected, width, plan.requests, plan.summary))
        if plan.attention < len(reads):
            reads = self._reads(ex, selected, width, plan.attention)
        lines.extend(reads)
        if plan.heat and selected is not None:
            lines.extend(self.heat_lines(ex, selected, width, plan.heat)[: plan.heat])
        if plan.logits:
            lines.append(self._logits(ex, width))
        # Every line was built to fit; `fit` only guards, cutting between words, never in one.
        lines = [fit(line, width) for line in lines]
        if len(lines) > height:  # (a panel below its min-height: say what is below)
            lines = lines[: height - 1] + [
                Text(f"… {count(len(lines) - height + 1, 'more line')}", DIM)
            ]
        return Text("\n").join(lines)

    def heat_lines(self, ex: ExecutorStep, span: RequestSpan, width: int, room: int) -> list[Text]:
        """The attention heat row under the selected request's block reads: at most `room`
        lines of at most `width` cells (`attention_heat.py`)."""
        mode = self.status.mode if self.status is not None else "live"
        hop = self.hop if ex.stage == ATTENTION else None
        probe = self.state.attention_probe
        return attention_heat(
            probe, span.request_id, ex.step, mode, self.attention_head, width, room, hop,
            attention_ran=ex.reached(ATTENTION),
        )  # fmt: skip

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
        head.rstrip()
        return head

    # --- the flat batch, one column a token ----------------------------------------------------

    def _cells(self, ex: ExecutorStep, c: TokenColumn) -> tuple[str, str, str, str, str, str]:
        """A column's six cells: row (its request's letter follows), text, id, position, slot,
        logits row."""
        info = self.state.requests.get(c.request_id)
        known = info is not None and c.position < len(info.tokens)
        text = escape_token(info.tokens[c.position]) if known else "?"  # type: ignore[union-attr]
        if cell_len(text) > MAX_TOKEN:
            text = text[: MAX_TOKEN - 1] + "…"
        logits = "·" if c.logits_row is None else ("✓" if c.sampled else "lp")
        slot = slot_label(c.slot, ex.inputs.block_size)
        return f"{c.row} ", text, str(c.token_id), str(c.position), slot, logits

    def _table(
        self, ex: ExecutorStep, columns: list[TokenColumn], selected: RequestSpan | None, width: int
    ) -> list[Text]:
        cells = [self._cells(ex, c) for c in columns]
        # A column is as wide as its widest cell (the row's also holds the letter), plus a gap.
        widths = [max(cell_len(x) for x in (*cell[1:], cell[0] + "A")) + 1 for cell in cells]
        room = width - LABEL_WIDTH - len(f"+{len(columns)}▸")
        paged = self._paged
        if paged is not None and paged[:2] == (ex.step, self.selected):
            start = paged[2]
        else:
            self._paged = None
            start = selected.query_start if selected else 0
        start = clamp_start(widths, start, room) if columns else 0
        end = column_window(widths, start, room)
        self._page = (widths, room, start)
        before, after = start, len(columns) - end
        title = Text(f"flat batch: {count(len(columns), 'token')}", HEADING)
        if before or after:
            title.append(
                first_fitting(
                    [f" · rows {start}-{end - 1} shown · [ ] pages", f" · rows {start}-{end - 1}"],
                    width - len(title),
                ),
                DIM,
            )
        rows = [Text(label.ljust(LABEL_WIDTH), DIM) for label in LABELS]
        if before:
            rows[0] = Text("◂" + "row".ljust(LABEL_WIDTH - 1), DIM)
        reading = selected.request_id if selected and ex.stage == ATTENTION else None
        for c, cell, w in zip(columns[start:end], cells[start:end], widths[start:end]):
            row, text, token_id, pos, slot, logits = cell
            rows[0].append(row, DIM)
            rows[0].append(self._letter(c.request_id))
            rows[0].append(" " * (w - len(row) - 1))
            style = READING if c.request_id == reading else ""
            rows[1].append(text + " " * (w - cell_len(text)), style)
            rows[2].append(token_id.ljust(w), DIM)
            rows[3].append(pos.ljust(w), style)
            rows[4].append(slot.ljust(w), FLASH if ex.stage == KV else "")
            if c.logits_row is None:
                rows[5].append(logits.ljust(w), DIM)
            else:  # ✓ sampled; lp: prompt logprobs only
                lit = ex.stage == LOGITS or (ex.stage == SAMPLED and c.sampled)
                rows[5].append(logits.ljust(w), FLASH if lit else "bold")
        if after:
            rows[0].append(f"+{after}▸", DIM)
        return [title, *rows]

    # --- each request: query start, tokens, context, block table --------------------------------

    def _legend(self, width: int) -> Text:
        return Text(
            first_fitting(
                [
                    "per request: q@query start ×tokens ctx context length [block table]",
                    "q@query start ×tokens ctx context [block table]",
                    "q@start ×tokens ctx [blocks]",
                ],
                width,
            ),
            DIM,
        )

    def _requests(
        self,
        ex: ExecutorStep,
        spans: list[RequestSpan],
        selected: RequestSpan | None,
        width: int,
        room: int,
        summary: bool,
    ) -> list[Text]:
        """`room` requests' lines, the selected one among them, in batch order; then, when
        some are left out, a line counting them."""
        if room <= 0:
            return []
        listed = [s for s in spans if s is not selected][: room - (selected is not None)]
        keep = {id(s) for s in listed} | {id(selected)}
        lines = [self._request(ex, s, s is selected, width) for s in spans if id(s) in keep]
        left = len(spans) - len(lines)
        if summary and left:
            n = count(left, "more request")
            lines.append(
                Text(first_fitting([f"… {n} not listed: ↑↓ selects one", f"… {n}"], width), DIM)
            )
        return lines

    def _sampled(self, request_id: str, tokens: tuple[int, ...]) -> list[str]:
        """The tokens a request sampled this step, one item each: id and text (`472 ' the'`)."""
        step = self.state.executor.step if self.state.executor else 0
        return sampled_words(self.state, step, request_id, tokens)

    def _request(self, ex: ExecutorStep, span: RequestSpan, selected: bool, width: int) -> Text:
        """`A r1 q@0 ×1 ctx 56 [0 1 22 24] · sampled 427`, its block table and its tail
        cut between two items to fit `width`."""
        line = self._letter(span.request_id)
        line.append(f" {short_id(span.request_id, ID_ROOM)}", "bold" if selected else "")
        line.append(f" q@{span.query_start} ×{span.query_len} ctx {span.seq_len} ")
        room = width - line.cell_len
        blocks = [str(b) for b in span.block_table]
        table_full = 2 + len(" ".join(blocks))
        # The tail gets what the whole table leaves, or else what its first two blocks and
        # the count of the rest leave (`[0 1 … 16 more]`).
        least = 2 + len(" ".join([*blocks[:2], TABLE_MORE(len(blocks) - 2)]))
        tail, style = self._request_tail(ex, span, room - table_full)
        if cell_len(tail) > room - table_full:
            tail, style = self._request_tail(ex, span, room - least)
        table = "[" + fit_list(blocks, room - cell_len(tail) - 2, " ", TABLE_MORE) + "]"
        line.append(table, DIM)
        line.append(self._other_tables(span, room - cell_len(tail) - len(table)), DIM)
        line.append(tail, style)
        return line

    def _other_tables(self, span: RequestSpan, room: int) -> str:
        """A hybrid model's other KV cache groups' tables after the first, ` [∅ ∅ 9 15]` (the
        null block as ∅), each cut to what `room` leaves; ` …` when not one more fits."""
        out = ""
        null = self.state.null_block
        for table in span.other_tables:
            blocks = [NULL if b == null else str(b) for b in table]
            left = room - len(out) - 3
            if left < 2 + len(TABLE_MORE(len(blocks))):
                return out + " …" if room - len(out) >= 2 else out
            out += " [" + fit_list(blocks, left, " ", TABLE_MORE) + "]"
        return out

    def _request_tail(self, ex: ExecutorStep, span: RequestSpan, room: int) -> tuple[str, Any]:
        """What a request's step ends in (a chunk's cut, its sampled tokens), in `room` cells
        or fewer: the longest wording that fits."""
        if not span.samples:
            cut = budget_cut(self.state) if self.state.last_step is not None else {}
            needed = cut.get(span.request_id) if ex.step == self.state.step else None
            of = f" of {needed} needed" if needed else ""
            variants = [
                f" · chunk{of}: the token budget cut it, no logits",
                f" · chunk{of}, no logits",
                " · chunk, no logits",
                " · chunk",
            ]
            return first_fitting(variants, room), "italic"
        sampled = dict(ex.sampled)
        if span.request_id not in sampled or not ex.reached(SAMPLED):
            return "", ""
        items = self._sampled(span.request_id, sampled[span.request_id])
        style = FLASH if ex.stage == SAMPLED else "bold"
        whole = " ".join(items)
        return first_fitting(
            [
                f" · sampled {whole}",
                f" → {whole}",
                " → " + fit_list(items, room - 3, " ", more("")),
                f" → {count(len(items), 'token')}",
            ],
            room,
        ), style

    # --- attention, block by block ---------------------------------------------------------------

    def _reads(
        self, ex: ExecutorStep, span: RequestSpan | None, width: int, max_lines: int
    ) -> list[Text]:
        """The selected request's context read block by block through its block table,
        `L0→#0[16] ⇢ L1→#1[16]`, over at most `max_lines` lines, the rest counted."""
        if span is None or max_lines < 1:
            return []
        reads = block_reads(span, ex.inputs.block_size)
        items = [f"L{logical}→#{block}[{n}]" for logical, block, n in reads]
        who = short_id(span.request_id, ID_ROOM)
        heads = [
            ("attention", f" {who} reads ctx {span.seq_len}: "),
            ("attention", f" {who}: "),
            ("attn", ": "),
        ]
        # The longest heading that leaves room for a block read on its line.
        for word, rest in heads:
            start = len(word) + 2 + len(rest)  # `attention A r1 reads ctx 56: `
            wrapped = wrap_items(items, width, max_lines, READS, more("block"), first=start)
            if not items or (wrapped.lines and wrapped.lines[0]):
                break
        now = self.hop % len(reads) if reads and ex.stage == ATTENTION else None
        lines = []
        for n, indices in enumerate(wrapped.lines):
            if n == 0:
                line = Text(word, HEADING)
                line.append(" ")
                line.append(self._letter(span.request_id))
                line.append(rest)
            else:
                line = Text("  ")
            for k, i in enumerate(indices):
                style = READING if i == now else ("bold" if ex.reached(ATTENTION) else DIM)
                line.append(items[i], style)
                if k < len(indices) - 1:
                    line.append(READS, DIM)
            lines.append(line)
        if wrapped.marker and lines:
            hidden = now is not None and now >= wrapped.shown
            gap = " " if wrapped.lines[-1] else ""
            lines[-1].append(gap + wrapped.marker, READING if hidden else DIM)
        return lines

    # --- the logits rows ---------------------------------------------------------------------

    def _logits(self, ex: ExecutorStep, width: int) -> Text:
        rows = ex.inputs.logits_rows
        n = ex.inputs.num_sampled_rows
        line = Text("logits ", HEADING)
        if not rows:
            line.append(
                first_fitting(
                    ["no row: no request reached the end of its prompt", "no row"], width - 7
                ),
                DIM,
            )
            return line
        vocab = f" × {ex.vocab_size}" if ex.vocab_size else ""
        line.append(f"[{len(rows)}{vocab}] of {len(ex.inputs.input_ids)} rows: ")
        prompt = rows[n:]
        tail = ""
        if prompt:
            tail = first_fitting(
                [
                    f" + prompt logprobs {' '.join(map(str, prompt))}",
                    f" + {count(len(prompt), 'prompt logprobs row')}",
                ],
                (width - line.cell_len) // 2,
            )
        sampled = fit_list(
            [str(r) for r in rows[:n]], width - line.cell_len - len(tail), " ", more("row")
        )
        line.append(sampled, FLASH if ex.stage == LOGITS else "bold")
        line.append(tail, DIM)
        return line
