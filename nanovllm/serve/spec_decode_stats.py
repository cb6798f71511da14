"""Speculative decoding's counters for `/metrics`, as vLLM keeps them.

vLLM exports four counters when it speculates (`vllm/v1/spec_decode/metrics.py`):

    spec_decode_num_drafts                 verifications: a request checked its proposals
    spec_decode_num_draft_tokens           tokens proposed
    spec_decode_num_accepted_tokens        proposed tokens accepted
    spec_decode_num_accepted_tokens_per_pos{position="i"}
                                           drafts whose proposal i (from 0) was accepted

From them a dashboard computes the acceptance rate (accepted / draft tokens), the mean
accepted length (1 + accepted / drafts) and the acceptance rate at each position (per_pos[i] /
drafts): how far into a proposal the proposer stays right.

The first three are the engine's own `LLMEngine.spec_stats`. The engine does not count per
position, so `AcceptedPerPosition` counts it from the `SpecTokensVerified` events (the first
`num_accepted` proposals of a draft were accepted). It subscribes to the engine's events, which
makes the engine build every event, not only these: measured on the embedded model on a CPU
(8 greedy requests of 64 tokens, k = 4, 5 interleaved runs), 3% more time per step than with no
subscriber. The server subscribes only when the engine speculates.
"""

from __future__ import annotations

from nanovllm.events import Event, SpecTokensVerified


class AcceptedPerPosition:
    """An engine event subscriber: per position 0..k-1, the drafts that had it accepted.

    Runs on the engine thread (inside `LLMEngine.step`); read `counts` on that thread too.
    """

    def __init__(self, num_speculative_tokens: int) -> None:
        self.counts = [0] * num_speculative_tokens

    def __call__(self, event: Event) -> None:
        if isinstance(event, SpecTokensVerified):
            for position in range(event.num_accepted):
                self.counts[position] += 1
