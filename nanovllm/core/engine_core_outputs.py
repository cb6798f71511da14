"""EngineCoreOutputs: what the engine core's half of a step hands to the output processor.

vLLM v1 ends a step in two halves. The engine core's `update_from_output` advances each request
by its sampled tokens: the scheduler's bookkeeping (`num_computed_tokens`, the output token ids,
finished requests' blocks). The output processor then turns what that produced into text, stop
checks and the caller's `RequestOutput`s. This is the hand-over between them: nothing in it
refers back to the step's `SchedulerOutput`, so the output processor never reads the scheduler's
decision, only its result.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanovllm.request import Request


@dataclass
class EngineCoreOutputs:
    step: int  # the step's number (its events carry it)
    updated: list[tuple[Request, int]]  # each request that got tokens, and how many
    failed: list[Request]  # requests ended because their own sampling failed
    # request id -> per new token {token id: (logprob, rank)}, for requests that asked
    logprobs: dict[str, list[dict[int, tuple[float, int]]]]
    # request id -> [(prompt index, {token id: (logprob, rank)})], for requests that asked
    prompt_logprobs: dict[str, list[tuple[int, dict[int, tuple[float, int]]]]]
