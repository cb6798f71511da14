"""Speculative decoding's counters: how much was proposed, and how much of it was accepted.

Whether speculating pays comes down to one ratio: tokens accepted per token proposed. A step
that verifies k proposals for a request and accepts a of them adds a + 1 tokens for the price of
one forward pass over k + 1 positions, so `mean_accepted_length` (1 + accepted per verifying
step) is the speed-up in steps, and `num_accepted_tokens_per_pos` shows how quickly the
proposer's guesses go wrong along a proposal.

The counters and their names are vLLM's (vllm/v1/spec_decode/metrics.py, `SpecDecodingStats`);
each verification is also a `SpecTokensVerified` event, for the visualizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nanovllm.events import EventBus, SpecTokensVerified

if TYPE_CHECKING:
    from nanovllm.core.scheduler import SchedulerOutput


@dataclass
class SpecDecodingStats:
    """Speculative decoding so far, vLLM's counters: how many times requests verified proposals
    (`num_drafts`), how many tokens were proposed, how many of those were accepted, and per
    position i (from 0) how many drafts had their proposal i accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def record(self, num_proposed: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        per_pos = self.num_accepted_tokens_per_pos
        per_pos.extend([0] * (num_accepted - len(per_pos)))
        for position in range(num_accepted):  # the first num_accepted were accepted
            per_pos[position] += 1

    def record_step(
        self, sched: SchedulerOutput, sampled: dict[str, list[int]], events: EventBus
    ) -> None:
        """Record the proposals a step verified (`sampled`: each request's accepted proposals
        and the one token after them), each also as a `SpecTokensVerified` event."""
        for s in sched.scheduled:
            tokens = sampled.get(s.request.request_id)
            if not s.to_verify or tokens is None:
                continue
            num_accepted = len(tokens) - 1
            self.record(len(s.to_verify), num_accepted)
            if events.active:
                events.emit(
                    SpecTokensVerified(
                        sched.step, s.request.request_id, tuple(s.to_verify), num_accepted
                    )
                )

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verifying step: the accepted proposals plus the one the step adds."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
