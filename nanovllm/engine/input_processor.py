"""Input processing: a caller's (request id, prompt, SamplingParams) become queued `Request`s.

    add_request(id, prompt, params)
        -> tokenize (text, token ids, or a dict of either)
        -> check: every reason the request could never run, named (ValueError)
        -> n > 1: fan out into n children (`parallel_sampling.py`)
        -> each Request gets its arrival number and, when it samples unseeded, a seed

It is the engine's door. Everything that can make a request fail before it runs is checked here,
before the request takes a block or a place in a queue, so a bad request can never disturb the
ones already running: an empty prompt, a token id outside the vocabulary, a prompt that leaves
no room under `max_model_len`, a request longer than the whole KV cache, too many logprobs, a
`logit_bias`, `allowed_token_ids` or `bad_words` token outside the vocabulary, an id already in
use. The error names the bad value, and a `RequestRejected` event says the same.

Seeds: a sampled request without a seed gets one drawn from the engine's seed, so that a run of
an engine built with the same seed draws the same tokens again.

This is vLLM's `InputProcessor` (vllm/v1/engine/input_processor.py) with its fan-out, which
vLLM's `LLMEngine.add_request` does, folded in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nanovllm.engine.logits_checks import check_token_ids_in_vocab
from nanovllm.engine.parallel_sampling import ParentRequest, child_params, child_request_id
from nanovllm.events import EventBus, RequestRejected
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams
from nanovllm.structured_output.manager import StructuredOutputManager

Prompt = str | list[int] | dict


class InputProcessor:
    def __init__(
        self,
        tokenizer,
        *,
        vocab_size: int,
        max_model_len: int,
        num_kv_blocks: int,
        block_size: int,
        num_lookahead_tokens: int,
        blocks_needed: Callable[[int], int] | None = None,
        eos_token_ids: frozenset[int],
        seed: int,
        events: EventBus,
        is_known: Callable[[str], bool],
    ) -> None:
        """`is_known(request_id)`: whether the engine already holds a request with that id.
        `blocks_needed(num_slots)`: the most of the `num_kv_blocks` a request of that many KV
        slots holds at once (default: one block per `block_size` slots; with sliding windows,
        fewer: `KVCacheConfig.max_blocks_needed`)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.num_lookahead_tokens = num_lookahead_tokens
        self.blocks_needed = blocks_needed or (lambda num_slots: -(-num_slots // block_size))
        self.eos_token_ids = eos_token_ids
        self.events = events
        self.is_known = is_known
        self.num_arrivals = 0
        # Structured outputs: grammars compiled at arrival, each request's own matcher.
        self.structured_output = StructuredOutputManager(tokenizer, vocab_size, eos_token_ids)
        self.compiling: list[Request] = []  # accepted, their grammar still compiling
        # torch's generator, so that an engine seed gives the seeds it gave before this class
        # existed (and so the same sampled tokens).
        self._seed_rng = torch.Generator().manual_seed(seed)

    def process_inputs(
        self, request_id: str, prompt: Prompt, params: SamplingParams | None = None
    ) -> tuple[list[Request], ParentRequest | None]:
        """The checked requests for one call of `add_request`: the request alone (and None), or
        with `params.n > 1` its n children and their parent. Raises ValueError naming the bad
        value, after emitting `RequestRejected`."""
        request_id = str(request_id)
        params = params or SamplingParams()
        try:
            if self.is_known(request_id):
                raise ValueError(f"request id {request_id!r} is already in the engine")
            text, token_ids = self.tokenize(prompt)
            fan_out = isinstance(params, SamplingParams) and params.n > 1
            if not fan_out:
                requests = [self._make_request(request_id, text, token_ids, params)]
            else:
                requests = [
                    self._make_request(
                        child_request_id(request_id, i), text, token_ids, child_params(params, i)
                    )
                    for i in range(params.n)
                ]
        except ValueError as exc:
            if self.events.active:
                self.events.emit(RequestRejected(request_id, str(exc)))
            raise
        for request in requests:
            so = request.structured_output_request
            if so is not None and so.grammar is None:
                self.compiling.append(request)
        if not fan_out:
            return requests, None
        for i, child in enumerate(requests):
            child.parent_id, child.index = request_id, i
        parent = ParentRequest(request_id, text, requests[0].prompt_token_ids, requests)
        return requests, parent

    def take_failed(self) -> list[tuple[Request, str]]:
        """Of the requests accepted with a grammar still compiling (each step): (request, error)
        for each whose compile failed or ran too long. Those compiled have their matcher now
        (the scheduler runs them from now on); an aborted one is dropped."""
        if not self.compiling:
            return []
        self.compiling, failed = self.structured_output.take_compiled(self.compiling)
        return failed

    def wait_for_compiles(self) -> None:
        """With nothing to run, block until one of those grammars has compiled (or a moment),
        rather than spin."""
        if self.compiling:
            self.structured_output.wait_for_any(self.compiling)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt given as text, token ids, or a dict holding either."""
        return tokenize_prompt(self.tokenizer, prompt)

    def _make_request(
        self, request_id: str, text: str | None, token_ids: list[int], params: SamplingParams
    ) -> Request:
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"sampling params must be a SamplingParams, got {type(params).__name__}"
            )
        if self.is_known(request_id):
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if not token_ids:
            raise ValueError(
                f"prompt {text if text is not None else token_ids!r} is empty: it has no tokens"
            )
        vocab = self.vocab_size
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})")
        if params.logprobs is not None and params.logprobs > vocab:
            raise ValueError(f"logprobs={params.logprobs} exceeds the vocabulary size {vocab}")
        check_token_ids_in_vocab(params, self.tokenizer, vocab)
        n = len(token_ids)
        if n >= self.max_model_len:
            raise ValueError(
                f"prompt of {n} tokens does not fit max_model_len={self.max_model_len} "
                "(at least one token must be generated)"
            )
        max_tokens = min(params.max_tokens or self.max_model_len, self.max_model_len - n)
        lookahead = self.num_lookahead_tokens
        # The last token is sampled, never computed: it needs no slot.
        needed = self.blocks_needed(n + max_tokens - 1 + lookahead)
        if needed > self.num_kv_blocks:
            extra = f" + {lookahead} lookahead slots for the draft model" if lookahead else ""
            raise ValueError(
                f"prompt of {n} tokens plus max_tokens={max_tokens} needs {n + max_tokens - 1} KV "
                f"slots{extra} ({needed} blocks of {self.block_size}), more than the whole KV "
                f"cache ({self.num_kv_blocks} blocks)"
            )
        structured_output_request = self.structured_output.grammar_init(params)  # may refuse
        seed = params.seed
        if seed is None and not params.greedy:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        self.num_arrivals += 1
        return Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_index=self.num_arrivals,
            prompt=text,
            max_tokens=max_tokens,
            eos_token_ids=self.eos_token_ids,
            seed=seed,
            structured_output_request=structured_output_request,
        )


def tokenize_prompt(tokenizer, prompt: Prompt) -> tuple[str | None, list[int]]:
    """(text, token ids) of a prompt given as text, token ids, or a dict holding either."""
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return tokenize_prompt(tokenizer, prompt["prompt"])
        raise ValueError(
            f"prompt dict needs 'prompt' or 'prompt_token_ids', got keys {list(prompt)}"
        )
    if isinstance(prompt, list | tuple):
        return None, list(prompt)
    raise ValueError(
        f"prompt must be a string, a token id list or a dict, got {type(prompt).__name__}"
    )
