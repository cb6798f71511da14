"""The model executor's step, as the visualizer keeps it: the flat inputs and the stage reached.

The executor's events (`nanovllm/executor/step_events.py`) tell a step in the engine's order:
`StepInputsPrepared` (the flat tensors: one entry per token, one per request), `KVWritten`,
`AttentionComputed`, `LogitsComputed`, `TokensSampled`. `reduce_executor` keeps the latest
step's inputs and how far it has got; the figures the executor panel draws
(`widgets/executor.py`) are read off them here, unchanged: a token's position, its slot
(`block·block_size+offset`), each request's query start and context length, which rows are
sampled. Nothing is computed from anything but those events.

Pure functions over frozen data, like the reducer (`state.py`) that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nanovllm.events import (
    WAITING_REASONS,
    AttentionComputed,
    Event,
    KVWritten,
    LogitsComputed,
    StepInputsPrepared,
    TokensSampled,
)
from nanovllm.viz.words import count

# The stages, in the engine's order, and what each is called on screen.
INPUTS, KV, ATTENTION, LOGITS, SAMPLED = "inputs", "kv", "attention", "logits", "sampled"
STAGES = (INPUTS, KV, ATTENTION, LOGITS, SAMPLED)
STAGE_NAMES = {
    INPUTS: "inputs",
    KV: "K/V write",
    ATTENTION: "attention",
    LOGITS: "logits",
    SAMPLED: "sampled",
}
EXECUTOR_EVENTS = (StepInputsPrepared, KVWritten, AttentionComputed, LogitsComputed, TokensSampled)
_STAGE_OF = {
    KVWritten: KV,
    AttentionComputed: ATTENTION,
    LogitsComputed: LOGITS,
    TokensSampled: SAMPLED,
}


@dataclass(frozen=True)
class ExecutorStep:
    """The latest step the executor ran: its inputs, and the stage its events have reached."""

    inputs: StepInputsPrepared
    stage: str = INPUTS
    sampled: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (request id, tokens), batch order
    attention_backend: str = ""
    num_layers: int = 0
    vocab_size: int = 0

    @property
    def step(self) -> int:
        return self.inputs.step

    def reached(self, stage: str) -> bool:
        """Whether the step's events have got to `stage` (or past it)."""
        return STAGES.index(self.stage) >= STAGES.index(stage)


@dataclass(frozen=True)
class TokenColumn:
    """One token of the flat batch: one column of the executor panel."""

    row: int  # its row in the flat batch
    request_id: str
    token_id: int
    position: int
    slot: int
    block: int  # slot // block_size: the physical block its K/V goes to
    offset: int  # slot % block_size
    logits_row: int | None  # its row among the logits, None when it has none
    sampled: bool  # its logits are sampled (not only prompt logprobs)


@dataclass(frozen=True)
class RequestSpan:
    """One request of the flat batch: its tokens' rows and its context."""

    request_id: str
    query_start: int  # its first row
    query_len: int  # its tokens this step
    seq_len: int  # context length after the step: what its attention reads
    block_table: tuple[int, ...]  # the blocks its attention reads, in logical order
    samples: bool  # one of its rows is sampled (a chunk short of its prompt's end: False)
    # A hybrid model's other KV cache groups' tables, in group order (`group_view`).
    other_tables: tuple[tuple[int, ...], ...] = ()


def reduce_executor(current: ExecutorStep | None, event: Event) -> ExecutorStep | None:
    """The executor's latest step after `event` (an executor event; others change nothing)."""
    if isinstance(event, StepInputsPrepared):
        return ExecutorStep(event)
    stage = _STAGE_OF.get(type(event))
    if current is None or stage is None or getattr(event, "step", None) != current.step:
        return current  # (a stage of a step whose inputs this trace does not hold)
    current = replace(current, stage=stage)
    if isinstance(event, KVWritten):
        return replace(current, num_layers=event.num_layers)
    if isinstance(event, AttentionComputed):
        return replace(current, attention_backend=event.attention_backend)
    if isinstance(event, LogitsComputed):
        return replace(current, vocab_size=event.vocab_size)
    if isinstance(event, TokensSampled):
        return replace(current, sampled=tuple(zip(event.request_ids, event.token_ids)))
    return current


def group_view(inputs: StepInputsPrepared, group: int) -> StepInputsPrepared:
    """The step as KV cache group `group`'s layers see it: that group's slot per token and
    block table per request in the place of group 0's (`inputs` itself for group 0, or for a
    group the event does not hold)."""
    if not 0 < group <= len(inputs.group_block_tables):
        return inputs
    return replace(
        inputs,
        slot_mapping=inputs.group_slot_mappings[group - 1],
        block_tables=inputs.group_block_tables[group - 1],
    )


def token_columns(inputs: StepInputsPrepared) -> list[TokenColumn]:
    """The flat batch, one column a token, with every figure as the engine sent it."""
    owner = [""] * len(inputs.input_ids)
    for i, rid in enumerate(inputs.request_ids):
        for row in range(inputs.query_start_loc[i], inputs.query_start_loc[i + 1]):
            owner[row] = rid
    logits_row = {row: n for n, row in enumerate(inputs.logits_rows)}
    size = inputs.block_size
    return [
        TokenColumn(
            row=row,
            request_id=owner[row],
            token_id=token,
            position=inputs.positions[row],
            slot=slot,
            block=slot // size,
            offset=slot % size,
            logits_row=logits_row.get(row),
            sampled=logits_row.get(row, inputs.num_sampled_rows) < inputs.num_sampled_rows,
        )
        for row, (token, slot) in enumerate(zip(inputs.input_ids, inputs.slot_mapping))
    ]


def request_spans(inputs: StepInputsPrepared, group: int = 0) -> list[RequestSpan]:
    """Each request of the batch: query start, tokens, context length, the blocks it reads in
    KV cache group `group`, and its tables in the other groups."""
    sampled_rows = set(inputs.logits_rows[: inputs.num_sampled_rows])
    every = (inputs.block_tables, *inputs.group_block_tables)  # [group][request]
    shown = group if group < len(every) else 0
    spans = []
    for i, rid in enumerate(inputs.request_ids):
        start, end = inputs.query_start_loc[i], inputs.query_start_loc[i + 1]
        spans.append(
            RequestSpan(
                rid,
                start,
                end - start,
                inputs.seq_lens[i],
                every[shown][i],
                any(row in sampled_rows for row in range(start, end)),
                tuple(tables[i] for g, tables in enumerate(every) if g != shown),
            )
        )
    return spans


def block_reads(span: RequestSpan, block_size: int) -> list[tuple[int, int, int]]:
    """(logical block, physical block, tokens read from it) in the order attention reads them."""
    reads = []
    for logical, block in enumerate(span.block_table):
        n = min(block_size, span.seq_len - logical * block_size)
        if n > 0:
            reads.append((logical, block, n))
    return reads


def written_slots(events: tuple[Event, ...]) -> frozenset[int]:
    """The slots the step's K/V went to while `KVWritten` is the latest of `events` (the
    step's so far): the views light them up."""
    last = events[-1] if events else None
    if not isinstance(last, KVWritten):
        return frozenset()
    return frozenset(last.slot_mapping).union(*last.group_slot_mappings)


def slot_label(slot: int, block_size: int) -> str:
    """A slot as `block·block_size+offset`, e.g. `12·16+3`."""
    return f"{slot // block_size}·{block_size}+{slot % block_size}"


# --- in words (the narrative's notes for these events) -------------------------------------------


def executor_words(event: Event) -> str | None:
    """A few words for an executor event, in the engine's terms; a step's five are told as one
    line (`narrative.merge` joins them with arrows)."""
    if isinstance(event, StepInputsPrepared):
        spans = request_spans(event)
        tokens, requests = count(len(event.input_ids), "token"), count(len(spans), "request")
        text = f"executor: {tokens} of {requests} in one flat batch"
        chunks = [s.request_id for s in spans if not s.samples]
        if chunks:
            text += f" ({' '.join(chunks)}: a chunk, no logits row)"
        return text
    if isinstance(event, KVWritten):
        return (
            f"K/V into {count(len(event.slot_mapping), 'slot')} ×{count(event.num_layers, 'layer')}"
        )
    if isinstance(event, AttentionComputed):
        return "attention through the block tables"
    if isinstance(event, LogitsComputed):
        rows = " ".join(map(str, event.logits_rows))
        return f"logits of rows {rows}" if rows else "no logits row"
    if isinstance(event, TokensSampled):
        got = " ".join(
            f"{r}→{','.join(map(str, t))}" for r, t in zip(event.request_ids, event.token_ids)
        )
        return f"sampled {got}" if got else "nothing sampled"
    return None


def waiting_words(reason: str | None, head: str | None, num_waiting: int) -> str:
    """Why the waiting requests wait, as the step's summary says it."""
    if reason is None or head is None:
        return ""
    behind = f" ({num_waiting - 1} more behind it)" if num_waiting > 1 else ""
    return f"; {head} waits{behind}: {WAITING_REASONS.get(reason, reason)}"
