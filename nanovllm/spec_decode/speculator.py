"""The engine's speculation part: after each step, count what was verified, then propose.

The engine calls its speculator at one place, when a step's tokens are in
(`LLMEngine.update_from_output` and `finish_step`): `record` counts the step's verified proposals
(`SpecDecodingStats`) and `propose` finds every decoding request's tokens to verify next step
(`propose.py`). The speculator keeps them: `tokens_to_verify` is the scheduler's `ExtraTokens`
question (`core/extra_tokens.py`), asked for each running request it schedules, whose answer it
computes as ordinary tokens, after the request's own; the sampler's verifier checks them (`executor/rejection_sampler.py`). Each step's
proposals replace the last's, so a request that did not run (preempted, or left out by the
token budget) never gets stale ones.

`NoSpeculation`, an engine's part when it does not speculate, does none of this, so the engine
has no "does it speculate?" branches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nanovllm.events import EventBus
from nanovllm.request import Request
from nanovllm.spec_decode.metrics import SpecDecodingStats
from nanovllm.spec_decode.propose import propose_next_tokens

if TYPE_CHECKING:
    from nanovllm.core.kv_cache_manager import KVCacheManager
    from nanovllm.core.scheduler import SchedulerOutput
    from nanovllm.spec_decode.draft_model_proposer import DraftModelProposer
    from nanovllm.spec_decode.ngram_proposer import NgramProposer


class Speculator:
    """A proposer (an n-gram search or a draft model) and its counts."""

    def __init__(
        self, proposer: NgramProposer | DraftModelProposer, stats: SpecDecodingStats
    ) -> None:
        self.proposer = proposer
        self.stats = stats
        self.proposals: dict[str, list[int]] = {}  # by request id, for the next step

    def record(
        self, sched: SchedulerOutput, sampled: dict[str, list[int]], events: EventBus
    ) -> None:
        self.stats.record_step(sched, sampled, events)

    def propose(self, running: Sequence[Request], kv_cache_manager: KVCacheManager) -> float:
        """Find every decoding request's tokens to verify next step; the seconds it took."""
        start = time.perf_counter()
        table_of = kv_cache_manager.get_block_table
        self.proposals = propose_next_tokens(self.proposer, running, table_of)
        return time.perf_counter() - start

    def tokens_to_verify(self, request: Request) -> list[int]:
        """The scheduler's question: `request`'s proposal for this step (none: [])."""
        return self.proposals.get(request.request_id, [])


class NoSpeculation:
    """The speculator of an engine that does not speculate: it records and proposes nothing."""

    proposer = None

    def record(self, sched: SchedulerOutput, sampled: dict[str, list[int]], events) -> None:
        pass

    def propose(self, running: Sequence[Request], kv_cache_manager: KVCacheManager) -> float:
        return 0.0

    def tokens_to_verify(self, request: Request) -> list[int]:
        return []


def speculator_for(
    proposer: NgramProposer | DraftModelProposer | None, stats: SpecDecodingStats
) -> Speculator | NoSpeculation:
    return NoSpeculation() if proposer is None else Speculator(proposer, stats)
