"""Output processing: a step's sampled tokens become text, stops, and the caller's outputs.

    (request, its new tokens)   from Scheduler.update_from_output
        -> per token: detokenize (`detokenizer.py`), check the stops in order
           (a stop string, EOS, a stop token id, max_tokens); tokens after a stop are dropped
        -> RequestOutput per request: CUMULATIVE, DELTA or FINAL_ONLY (`SamplingParams.output_kind`)
        -> n > 1: the children's completions gathered into their parent's output (fan-in)
        -> a finished request is forgotten

It holds the per-request state that only outputs need, from `add_request` until the request's
final output: its `DetokenizerState` (none with `detokenize=False`), and the `ParentRequest` of
each fanned-out request. Everything else about a request (its tokens, its blocks, its place in
a queue) is the scheduler's; ending a request is too, so a stop is handed to the scheduler's
`finish_request`.

Tokens are checked one at a time even when a step brings several (speculative decoding): the
detokenizer sees only the tokens up to the one being checked, so a stop string that completes at
the second of three tokens cuts the text there and the third is dropped.

This is vLLM's `OutputProcessor` (vllm/v1/engine/output_processor.py), which also checks the
stop strings; vLLM checks EOS, stop token ids and max_tokens in the scheduler, nanovllm here.
"""

from __future__ import annotations

from collections.abc import Callable

from nanovllm.engine.detokenizer import (
    DetokenizerState,
    IncrementalDetokenizer,
    find_stop_string,
    take_streamable,
)
from nanovllm.engine.outputs import CompletionOutput, Logprob, RequestOutput
from nanovllm.engine.parallel_sampling import ParentRequest
from nanovllm.events import EventBus, TokenEmitted
from nanovllm.executor.prompt_logprobs import PromptLogprobs
from nanovllm.request import FinishReason, Request
from nanovllm.sampling_params import RequestOutputKind
from nanovllm.structured_output.manager import grammar_finish

# One request's progress in a step: (the request, its new text, its new token ids).
Progress = tuple[Request, str, list[int]]


class OutputProcessor:
    def __init__(self, tokenizer, events: EventBus, detokenizer=IncrementalDetokenizer) -> None:
        self.tokenizer = tokenizer
        # The incremental detokenizer every request's text goes through (`detokenizer` makes
        # it: the engine's, or lesson 10's, `engine/parts.py`).
        self.detokenizer = detokenizer(tokenizer)
        self.events = events
        self.parent_requests: dict[str, ParentRequest] = {}  # requests with n > 1, by caller id
        # Every request not yet forgotten; None for those with detokenize=False.
        self._detok: dict[str, DetokenizerState | None] = {}
        # Requests that asked for logprobs: the sum of their sampled tokens' logprobs so far.
        self._cumulative_logprob: dict[str, float] = {}
        self._token_texts: dict[int, str] = {}  # each token's own text (`decoded_token`)
        # Requests that asked for prompt logprobs: an entry per prompt token (None until known).
        self._prompt_logprobs: dict[str, list[dict[int, tuple[float, int]] | None]] = {}

    def add_request(self, request: Request, parent: ParentRequest | None = None) -> None:
        """Start following `request` (with n > 1, a child of `parent`)."""
        params = request.sampling_params
        self._detok[request.request_id] = (
            DetokenizerState.after_prompt(request.prompt_token_ids, params.skip_special_tokens)
            if params.detokenize
            else None
        )
        if params.logprobs is not None:
            self._cumulative_logprob[request.request_id] = 0.0
        if params.prompt_logprobs is not None:
            self._prompt_logprobs[request.request_id] = [None] * request.num_prompt_tokens
        if parent is not None:
            self.parent_requests[parent.request_id] = parent

    def has_unfinished_requests(self) -> bool:
        return bool(self._detok)

    def requests_to_abort(self, request_id: str, requests: dict[str, Request]) -> list[Request]:
        """The requests that aborting `request_id` ends, as vLLM's `abort_requests` finds them:
        a parent's unfinished children (n > 1), or else the request of that id in `requests`."""
        parent = self.parent_requests.get(request_id)
        if parent is not None:
            return [child for child in parent.children if not child.is_finished]
        if request_id not in requests:
            raise ValueError(f"cannot abort unknown request id {request_id!r}")
        return [requests[request_id]]

    def output_text(self, request_id: str) -> str:
        """A request's output text so far ("" when it is not detokenized or not followed)."""
        state = self._detok.get(request_id)
        return state.text if state is not None else ""

    def add_prompt_logprobs(self, entries: PromptLogprobs) -> None:
        """Keep a step's prompt logprob entries, each at its prompt token's index (a chunk
        computed again after a preemption puts the same entries in the same places)."""
        for request_id, new in entries.items():
            kept = self._prompt_logprobs.get(request_id)
            for index, entry in new if kept is not None else ():
                kept[index] = entry

    def process_new_tokens(
        self,
        step: int,
        updated: list[tuple[Request, int]],
        logprobs: dict[str, list[dict[int, tuple[float, int]]]],
        finish_request: Callable[[Request, FinishReason], None],
    ) -> list[Progress]:
        """Detokenize each request's `num_new` newest tokens and check them for a stop, in
        order; a request that stops loses the tokens after the stopping one and is ended with
        `finish_request` (the scheduler's: its blocks are freed) before the next request is
        looked at. `logprobs[request_id][j]` is the j-th new token's entry, when asked for."""
        emit = self.events.active
        progress: list[Progress] = []
        for request, num_new in updated:
            first = request.num_output_tokens - num_new
            new_tokens = request.output_token_ids[first:]
            entries = logprobs.get(request.request_id)
            text, finished = "", None
            for j, token in enumerate(new_tokens):
                num_output = first + j + 1
                if entries is not None:
                    request.logprobs.append(entries[j])
                    self._cumulative_logprob[request.request_id] += entries[j][token][0]
                token_ids = request.all_token_ids
                if j < num_new - 1:  # the detokenizer must not see the tokens after this one
                    token_ids = token_ids[: request.num_prompt_tokens + num_output]
                delta, finished = self._process_token(request, token, token_ids, num_output)
                text += delta
                if emit:
                    self.events.emit(
                        TokenEmitted(step, request.request_id, token, delta, num_output)
                    )
                if finished is not None:
                    drop_output_tokens_after(request, num_output)
                    break
            if finished is not None:
                finish_request(request, finished)
            progress.append((request, text, request.output_token_ids[first:]))
        return progress

    def _process_token(
        self, request: Request, token: int, token_ids: list[int], num_output: int
    ) -> tuple[str, FinishReason | None]:
        """Detokenize a new token (`token_ids` ends with it, the `num_output`-th output token)
        and decide whether the request is done."""
        params = request.sampling_params
        state = self._detok.get(request.request_id)
        stop = None
        # A stop token's own text is not output unless asked for (vLLM's detokenizer skips it).
        if token in params.stop_token_ids or (
            not params.ignore_eos and token in request.eos_token_ids
        ):
            token_ids = token_ids if params.include_stop_str_in_output else token_ids[:-1]
        if state is not None:
            self.detokenizer.step(state, token_ids)
            # min_tokens: no stop string is looked for in the text of the first min_tokens tokens
            # (vLLM's rule; the sampler keeps the stop tokens out until then).
            if num_output > params.min_tokens:
                stop = find_stop_string(
                    state, params.stop_strings, params.include_stop_str_in_output
                )
            else:
                state.stop_checked_upto = len(state.text)
        finished: FinishReason | None = None
        if stop is not None:
            finished, request.stop_reason = FinishReason.STOP, stop
        elif not params.ignore_eos and token in request.eos_token_ids:
            finished = FinishReason.STOP
        elif token in params.stop_token_ids:
            finished, request.stop_reason = FinishReason.STOP, token
        elif (ended := grammar_finish(request, token)) is not None:
            finished = ended  # the grammar ended the output (or refused the token)
        elif num_output >= request.max_tokens:
            finished = FinishReason.LENGTH
        if finished is not None:
            request.finish_reason = finished
            if stop is None and state is not None:  # (a stop-string cut decided the final text)
                self.detokenizer.step(state, token_ids, final=True)
        if state is None:
            return "", finished
        delta = take_streamable(state, params.stop_strings, finished is not None)
        return delta, finished

    def make_request_outputs(self, progress: list[Progress]) -> list[RequestOutput]:
        """The caller's view of this step's progress: one output per request, or per parent of
        children (n > 1), in the order they progressed; with `FINAL_ONLY`, only those that
        finished. Forgets what finished."""
        outputs: list[RequestOutput] = []
        parents: dict[str, ParentRequest] = {}
        for request, delta, delta_ids in progress:
            if (
                request.sampling_params.output_kind == RequestOutputKind.FINAL_ONLY
                and not request.is_finished
            ):
                continue  # (nobody reads it: skip building it, a real cost at every step)
            completion = self._completion(request, delta, delta_ids)
            if request.parent_id is None:
                outputs.append(
                    RequestOutput(
                        request_id=request.request_id,
                        prompt=request.prompt,
                        prompt_token_ids=request.prompt_token_ids,
                        outputs=[completion],
                        finished=request.is_finished,
                        num_cached_tokens=request.num_cached_tokens,
                        prompt_logprobs=self._prompt_logprobs_of(request),
                        delta_text=delta,
                        delta_token_ids=delta_ids,
                        error=request.error,
                    )
                )
            else:
                parent = self.parent_requests[request.parent_id]
                parent.completions[request.index] = completion
                if parent.prompt_logprobs is None:  # (a child that produced a token has them)
                    parent.prompt_logprobs = self._prompt_logprobs_of(request)
                parents[parent.request_id] = parent
            if request.is_finished:
                self._detok.pop(request.request_id, None)
                self._cumulative_logprob.pop(request.request_id, None)
                self._prompt_logprobs.pop(request.request_id, None)
        for parent in parents.values():
            if parent.output_kind == RequestOutputKind.FINAL_ONLY and not parent.finished:
                continue
            outputs.append(parent.output())
            if parent.finished:
                del self.parent_requests[parent.request_id]
        return outputs

    def _completion(self, request: Request, delta: str, delta_ids: list[int]) -> CompletionOutput:
        """One completion as the caller sees it: whole (`CUMULATIVE`, `FINAL_ONLY`), or only
        what this step added (`DELTA`: text, token ids and logprobs alike)."""
        params = request.sampling_params
        if params.output_kind == RequestOutputKind.DELTA:
            text, token_ids = delta, delta_ids
            entries = request.logprobs[len(request.logprobs) - len(delta_ids) :]
        else:
            text, token_ids = self.output_text(request.request_id), list(request.output_token_ids)
            entries = request.logprobs
        logprobs = None
        if params.logprobs is not None:
            logprobs = [
                {
                    t: Logprob(lp, rank, self._decoded(t, params.detokenize))
                    for t, (lp, rank) in e.items()
                }
                for e in entries
            ]
        return CompletionOutput(
            index=request.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=self._cumulative_logprob.get(request.request_id),
            logprobs=logprobs,
            finish_reason=str(request.finish_reason) if request.finish_reason else None,
            stop_reason=request.stop_reason,
            delta_text=delta,
            delta_token_ids=delta_ids,
        )

    def _prompt_logprobs_of(self, request: Request) -> list[dict[int, Logprob] | None] | None:
        """The request's prompt logprobs as the caller sees them, when it asked for them."""
        kept = self._prompt_logprobs.get(request.request_id)
        if kept is None:
            return None
        detokenize = request.sampling_params.detokenize
        return [
            None
            if entry is None
            else {
                t: Logprob(lp, rank, self._decoded(t, detokenize))
                for t, (lp, rank) in entry.items()
            }
            for entry in kept
        ]

    def _decoded(self, token: int, detokenize: bool) -> str | None:
        """A logprob entry's token as text (vLLM's `decoded_token`), None without detokenizing."""
        if not detokenize:
            return None
        text = self._token_texts.get(token)
        if text is None:  # (logprobs=-1 asks for every token's text, every step: decode once)
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text


def drop_output_tokens_after(request: Request, num_output_tokens: int) -> None:
    """Forget the request's output tokens past its first `num_output_tokens` (a stop condition
    met by a token in the middle of several accepted at once)."""
    extra = request.num_output_tokens - num_output_tokens
    if extra > 0:
        del request.output_token_ids[-extra:]
        del request.all_token_ids[-extra:]
