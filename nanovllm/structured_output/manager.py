"""StructuredOutputManager: each structured request's grammar, the step's masks, its end.

vLLM v1's design (vllm/v1/structured_output/): the engine holds one manager; per request, a
grammar compiled once (compiled grammars are cached by their constraint, so the same schema
asked for again is not compiled again) and a matcher of its own; per step, a bitmask row for
every logits row of a structured request, which the runner applies before sampling
(`bitmask.py`); after the step, each matcher advances by the tokens the request accepted.

The three moments, and where the engine calls them:

- `grammar_init`, when a request arrives (`InputProcessor`): check the constraint's size, and
  hand the compiling, which can take seconds, to a thread of its own (or take the compiled
  grammar from the cache). A constraint that is too large, or a small one (the most common)
  that does not parse, is a ValueError naming it, before the request takes anything; a large
  one is parsed in the compile thread too (its parse and check take ~0.2 s at 250 KB). The request then waits, as
  vLLM's does (its `WAITING_FOR_FSM`): the scheduler passes over it while the other requests
  run, until `grammar_ready` has installed its matcher. A compile that fails or runs past
  `max_compile_s` ends the request with an error naming it. With n > 1 each child gets its own
  matcher over the same compiled grammar.
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

import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from nanovllm.events import EventBus, GrammarMasked
from nanovllm.request import FinishReason, Request, RequestStatus
from nanovllm.sampling_params import SamplingParams, StructuredOutputsParams
from nanovllm.structured_output.backend_xgrammar import Grammar, XgrammarBackend
from nanovllm.structured_output.bitmask import GrammarBitmask, unpack_bitmask

# How many compiled grammars are kept (least recently used ones go first).
CACHE_SIZE = 128
# The bounds on one constraint: its text's length (a JSON Schema as its JSON, a choice list as
# a JSON list), checked before anything is parsed, and the seconds its compiling may take. A
# 256 KiB constraint parses in ~20 ms; compiling grows faster than the text (an enum of 20,000
# choices, 169 KB, compiles in ~0.6 s on the tests' 320-token vocabulary).
MAX_GRAMMAR_CHARS = 262_144
MAX_COMPILE_S = 10.0
# How long a step with nothing to run waits for a grammar being compiled.
GRAMMAR_WAIT_S = 0.01
# Constraints up to this long are parsed at arrival, on the caller's thread (under ~5 ms).
MAX_PARSE_AT_ARRIVAL_CHARS = 16_384


@dataclass
class StructuredOutputRequest:
    """A request's constraint and its own matcher (`Request.structured_output_request`).

    `grammar` is None while the compiled grammar is on its way (`compiled`, from the compile
    thread): the scheduler does not schedule the request until `grammar_ready` sets it."""

    params: StructuredOutputsParams
    compiled: Future
    submitted_at: float = field(default_factory=time.monotonic)
    grammar: Grammar | None = None


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's: its logits' width
        self.stop_token_ids = stop_token_ids
        self.backend: XgrammarBackend | None = None  # made with the first structured request
        # Compiled grammars by constraint, finished or on their way: a constraint asked for
        # again while it compiles waits for the same compile.
        self._compiled: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self.num_compiled = 0  # grammars compiled (not taken from the cache)
        self.max_grammar_chars = MAX_GRAMMAR_CHARS
        self.max_compile_s = MAX_COMPILE_S
        # One thread: compiles queue behind each other, never crowd the engine's cores. Made
        # with the first compile (an engine that never sees a grammar starts no thread).
        self._executor: ThreadPoolExecutor | None = None

    def grammar_init(self, params: SamplingParams) -> StructuredOutputRequest | None:
        """A new request's constraint, its compile started (None without structured_outputs).
        A ValueError naming the constraint when it is too large or does not parse."""
        constraint = params.structured_outputs
        if constraint is None:
            return None
        key = constraint.key
        size = len(key[1])
        if size > self.max_grammar_chars:
            raise ValueError(
                f"structured_outputs.{key[0].split('/')[0]} is {size} characters long, more "
                f"than the limit of {self.max_grammar_chars} characters for a constraint"
            )
        if self.backend is None:
            self.backend = XgrammarBackend(self.tokenizer, self.vocab_size, self.stop_token_ids)
        compiled = self._compiled.get(key)
        if compiled is None:
            grammar = None
            if size <= MAX_PARSE_AT_ARRIVAL_CHARS:
                grammar = self.backend.parse(constraint)  # may refuse, naming it
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="nanovllm-grammar")
            compiled = self._executor.submit(self.backend.compile, constraint, grammar)
            self.num_compiled += 1
            self._compiled[key] = compiled
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        request = StructuredOutputRequest(constraint, compiled)
        if compiled.done():  # the cache had it: the matcher at once
            self.grammar_ready(request)
        return request

    def grammar_ready(self, request: StructuredOutputRequest, now: float | None = None) -> bool:
        """Whether the request's matcher is installed, installing it once its grammar has
        compiled. A ValueError naming the constraint when the compile failed or has taken
        longer than `max_compile_s` (it goes on in its thread; its result is cached)."""
        if request.grammar is not None:
            return True
        compiled = request.compiled
        if compiled.done():
            error = compiled.exception()
            if error is not None:
                if self._compiled.get(request.params.key) is compiled:
                    del self._compiled[request.params.key]  # asked again: compiled again
                raise error
            request.grammar = self.backend.matcher(compiled.result())
            return True
        waited = (time.monotonic() if now is None else now) - request.submitted_at
        if waited > self.max_compile_s:
            kind = request.params.key[0].split("/")[0]
            raise ValueError(
                f"structured_outputs.{kind} took longer to compile than the limit of "
                f"{self.max_compile_s:g} s"
            )
        return False

    def take_compiled(self, requests: list[Request]) -> tuple[list[Request], list[tuple]]:
        """Of the requests waiting for their grammar (the engine's, each step, before it
        schedules): those still compiling (`WAITING_FOR_FSM`, which the scheduler passes over),
        and (request, error) for each whose compile failed or ran too long. The others have
        their matcher now and are `WAITING` again; an aborted one is dropped."""
        waiting, failed = [], []
        for request in requests:
            if request.is_finished:
                continue  # aborted while its grammar compiled
            try:
                ready = self.grammar_ready(request.structured_output_request)
            except ValueError as exc:
                failed.append((request, str(exc)))
                continue
            if not ready:
                request.status = RequestStatus.WAITING_FOR_FSM  # the scheduler passes over it
                waiting.append(request)
            elif request.status == RequestStatus.WAITING_FOR_FSM:
                request.status = RequestStatus.WAITING
        return waiting, failed

    def wait_for_any(self, requests: list[Request], timeout: float = GRAMMAR_WAIT_S) -> None:
        """Block until one of the requests' grammars has compiled, or `timeout` seconds (the
        engine, with nothing else to do, rather than spin)."""
        pending = [r.structured_output_request.compiled for r in requests]
        pending = [f for f in pending if not f.done()]
        if pending:
            wait(pending, timeout, FIRST_COMPLETED)


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
