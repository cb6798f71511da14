"""SchedulerOutput: one step's decision, what the scheduler hands the model runner.

For each request in the step (`ScheduledRequest`): how many tokens to compute and after how many
computed ones, its block tables, and whether the step samples its next token. For the step: the
requests preempted to make room, and what the optional parts add to it (vLLM keeps these in its
own `sched/output.py` too): a running request's tokens to verify (speculative decoding's
proposals, computed after its own, each with a logits row), the step's logits mask (structured
outputs), and the KV source's transfers (a KV connector's metadata, with the blocks the step
evicted from the prefix cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanovllm.core.logits_mask import LogitsMask, NoLogitsMask
from nanovllm.request import Request


@dataclass(slots=True)
class ScheduledRequest:
    """One request's part of a step."""

    request: Request
    num_new_tokens: int  # tokens to compute this step
    num_computed_tokens: int  # tokens whose KV was already in the cache before this step
    # Its block table in every KV cache group (`kv_cache_interface.py`): physical block ids,
    # logical order, the KV cache manager's own tuples, each the same object as in the request's
    # previous step unless a block was added or given back since.
    block_tables: tuple[tuple[int, ...], ...]
    # True when this step reaches the end of the request's known tokens: sample the next one.
    samples: bool
    # Decode = exactly the one token sampled last step (plus tokens to verify); anything else
    # computes prompt (or recomputes lost) tokens: a prefill, and a prefill *chunk* when it does
    # not sample.
    is_prefill: bool
    # Guesses of its next tokens, computed after its own, for the sampler to verify.
    to_verify: list[int] = field(default_factory=list)

    @property
    def block_table(self) -> tuple[int, ...]:
        """Its block table in the first KV cache group (a model without windows: its only one)."""
        return self.block_tables[0]

    def token_ids(self) -> list[int]:
        """The tokens this step computes: the request's own, then any to verify."""
        end = self.num_computed_tokens + self.num_new_tokens - len(self.to_verify)
        return self.request.all_token_ids[self.num_computed_tokens : end] + self.to_verify

    @property
    def num_logits_rows(self) -> int:
        """The rows it samples from, when it samples: its last own token's, then one per token
        to verify."""
        return 1 + len(self.to_verify)


@dataclass
class SchedulerOutput:
    step: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    schedule_time: float = 0.0
    # Structured outputs: the tokens rows may not take (`core/logits_mask.py`).
    logits_mask: LogitsMask = field(default_factory=NoLogitsMask)
    # KV connector: cached blocks handed out again (id, hash); its transfers (`kv_transfer/`).
    evicted_blocks: list[tuple[int, bytes]] = field(default_factory=list)
    kv_connector_metadata: object = None  # what its KV source sends the workers this step
    waiting_reason: str | None = None  # "token_budget": an unchunked prompt did not fit
    # No free block for the waiting head: (blocks it needed, blocks free) when it was decided;
    # requests that finish later in the step free more.
    waiting_blocks: tuple[int, int] | None = None

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
