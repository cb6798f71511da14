"""StructuredOutputManager: each structured request's grammar, the step's masks, its end.

vLLM v1's design (vllm/v1/structured_output/): the engine holds one manager; per request, a
grammar compiled once (compiled grammars are cached by their constraint, so the same schema
asked for again is not compiled again) and a matcher of its own; per step, a bitmask row for
every logits row of a structured request, which the runner applies before sampling
(`bitmask.py`); after the step, each matcher advances by the tokens the request accepted.

The three moments, and where the engine calls them:

- `grammar_init`, when a request arrives (`InputProcessor`): compile (or take from the cache)
  and start a matcher. A constraint that does not compile is a ValueError naming it, before the
  request takes anything. With n > 1 each child gets its own matcher over the same compiled
  grammar.
- `grammar_bitmask(sched)`, after scheduling (`LLMEngine.step`): the masks of the step's
  sampling rows. A request verifying k proposed tokens has k + 1 rows: row j is filled after
  tentatively accepting proposals 0..j-1, which are rolled back right after. (Proposals were
  cut to what the grammar allows when proposed; should one still be refused, the rows after it
  are left unmasked: verification rejects it, the mask having given it probability 0, so no
  token is ever taken from the rows behind it.)
- `grammar_valid_prefix(request, proposal)`, after proposing (`spec_decode/propose.py`): the
  proposed tokens are cut to the longest prefix the grammar allows, as vLLM does.
- `grammar_finish(request, token)`, for each token the request keeps (`OutputProcessor`):
  advance the matcher; when it has terminated (the grammar accepted an end token), the request
  ends with `stop`, as it would at EOS. This also ends it when `ignore_eos` is set: the grammar
  allowed nothing but EOS there, and anything after it would be outside the grammar.

The matcher follows output tokens only, which preemption by recompute does not change, so a
preempted request's matcher needs nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from nanovllm.events import EventBus, GrammarMasked
from nanovllm.request import FinishReason, Request
from nanovllm.sampling_params import SamplingParams, StructuredOutputsParams
from nanovllm.structured_output.backend_xgrammar import Grammar, XgrammarBackend
from nanovllm.structured_output.bitmask import GrammarBitmask, unpack_bitmask

# How many compiled grammars are kept (least recently used ones go first).
CACHE_SIZE = 128


@dataclass
class StructuredOutputRequest:
    """A request's constraint and its own matcher (`Request.structured_output_request`)."""

    params: StructuredOutputsParams
    grammar: Grammar


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's: its logits' width
        self.stop_token_ids = stop_token_ids
        self.backend: XgrammarBackend | None = None  # made with the first structured request
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.num_compiled = 0  # grammars compiled (not taken from the cache)

    def grammar_init(self, params: SamplingParams) -> StructuredOutputRequest | None:
        """A new matcher for a request with these params (None without structured_outputs)."""
        constraint = params.structured_outputs
        if constraint is None:
            return None
        if self.backend is None:
            self.backend = XgrammarBackend(self.tokenizer, self.vocab_size, self.stop_token_ids)
        key = constraint.key
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.backend.compile(constraint)
            self.num_compiled += 1
            self._compiled[key] = compiled
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        return StructuredOutputRequest(constraint, self.backend.matcher(compiled))


def grammar_bitmask(sched: Any, events: EventBus) -> GrammarBitmask | None:
    """The masks of the step's structured sampling rows (None when no row is structured).

    `sched` is the step's `SchedulerOutput`; logits rows follow its sampling requests in order,
    1 + len(to_verify) rows each (as `ModelRunner.sample` lays them out).
    """
    structured = []  # (scheduled request, its first logits row)
    row = 0
    for s in sched.scheduled:
        if not s.samples:
            continue
        if s.request.structured_output_request is not None:
            structured.append((s, row))
        row += 1 + len(s.to_verify)
    if not structured:
        return None
    num_rows = sum(1 + len(s.to_verify) for s, _ in structured)
    grammar0 = structured[0][0].request.structured_output_request.grammar
    bitmask = _allocate(num_rows, grammar0.vocab_size)  # [num_rows, words], all allowed
    rows: list[int] = []
    for s, first in structured:
        grammar = s.request.structured_output_request.grammar
        advanced = 0
        for j, token in enumerate([*s.to_verify, None]):
            if grammar.is_terminated():
                break  # (only EOS could have led here: the request ends at it)
            grammar.fill_bitmask(bitmask, len(rows))
            rows.append(first + j)
            if token is None or not grammar.accept_token(token):
                break
            advanced += 1
        grammar.rollback(advanced)
    bitmask = bitmask[: len(rows)]
    if events.active and rows:
        _emit_masked(sched, structured, rows, bitmask, grammar0.vocab_size, events)
    return GrammarBitmask(rows, bitmask) if rows else None


def _allocate(num_rows: int, vocab_size: int) -> torch.Tensor:
    """[num_rows, ceil(vocab / 32)] int32 with every bit set."""
    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def _emit_masked(
    sched: Any,
    structured: list[tuple[Any, int]],
    rows: list[int],
    bitmask: torch.Tensor,
    vocab_size: int,
    events: EventBus,
) -> None:
    """One `GrammarMasked` event: per structured request, how many tokens each row allowed."""
    counts = unpack_bitmask(bitmask, vocab_size).sum(dim=-1).tolist()  # [len(rows)]
    by_row = dict(zip(rows, counts))
    allowed: dict[str, tuple[int, ...]] = {}
    for s, first in structured:
        mine = [by_row[r] for r in range(first, first + 1 + len(s.to_verify)) if r in by_row]
        if mine:
            allowed[s.request.request_id] = tuple(mine)
    events.emit(GrammarMasked(sched.step, allowed, vocab_size))


def grammar_valid_prefix(request: Request, proposal: list[int]) -> list[int]:
    """The longest prefix of `proposal` (speculative decoding) that the request's grammar
    allows next; the matcher is left where it was."""
    so = request.structured_output_request
    if so is None or not proposal:
        return proposal
    grammar = so.grammar
    num_valid = 0
    for token in proposal:
        if grammar.is_terminated() or not grammar.accept_token(token):
            break
        num_valid += 1
    grammar.rollback(num_valid)
    return proposal[:num_valid]


def grammar_finish(request: Request, token: int) -> FinishReason | None:
    """Advance the request's matcher by `token`, which it keeps. STOP when the grammar has
    ended the output; ERROR when the token is not allowed (a mask that was not applied)."""
    so = request.structured_output_request
    if so is None:
        return None
    grammar = so.grammar
    if grammar.is_terminated():
        return FinishReason.STOP
    if not grammar.accept_token(token):
        request.error = (
            f"request {request.request_id!r}: output token {token} is not allowed by its "
            f"structured_outputs constraint {so.params.key[0]}"
        )
        return FinishReason.ERROR
    return FinishReason.STOP if grammar.is_terminated() else None
