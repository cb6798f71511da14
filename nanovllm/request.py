"""Request: one prompt's journey through the engine, and the bookkeeping that follows it.

A request moves through these states:

    WAITING --schedule--> RUNNING --finish--> FINISHED
       ^                     |
       +-----preempt---------+          (abort: any state -> FINISHED)

(and WAITING_FOR_FSM before WAITING while a request's grammar compiles, vLLM's name).

The single number that drives scheduling is `num_computed_tokens`: how many of the request's
tokens (prompt + output so far) already have their K and V in the paged cache. Each step the
scheduler gives the request `num_tokens - num_computed_tokens` more tokens to compute (or a
chunk of them). When it has caught up, the step's forward pass ends on its last token and the
sampler emits the next one. Prefill, chunked prefill, decode and recomputation after
preemption are all the same rule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nanovllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_FSM = "waiting_for_fsm"  # its grammar is compiling: not scheduled yet
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, after losing its blocks
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"
    ERROR = "error"  # the request could not go on (e.g. its logits were NaN); see `error`

    def __str__(self) -> str:
        return self.value


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    # The order in which the engine accepted it. For display and tests: the scheduler's FIFO
    # order is the order of its waiting queue, which this number does not drive.
    arrival_index: int
    prompt: str | None = None
    max_tokens: int = 16  # effective cap: min(params.max_tokens, max_model_len - prompt len)
    eos_token_ids: frozenset[int] = frozenset()  # the model's end-of-sequence tokens
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at admission
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # why it finished with FinishReason.ERROR
    # Parallel sampling (n > 1): the parent's id and this child's index
    # (`engine/parallel_sampling.py`).
    parent_id: str | None = None
    index: int = 0
    # Random sampling: the seed (the request's own, or one the engine drew for it) and the
    # generator made from it on the sampling device (by the sampler, on first use).
    seed: int | None = None
    generator: torch.Generator | None = None
    logprobs: list[dict[int, tuple[float, int]]] = field(default_factory=list)  # (logprob, place)
    # Structured outputs: its constraint and matcher (`structured_output/manager.py`'s
    # `StructuredOutputRequest`; untyped here, as the request knows nothing of grammars).
    structured_output_request: Any = None
    # Token ids, prompt then output, in one list: the KV cache manager hashes from it.
    all_token_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
