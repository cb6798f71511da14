"""Each step's proposals: which requests speculate next, and how many tokens each may propose.

After a step, every request that is decoding (its newest token sampled, not yet computed) gets
up to k proposed tokens for the next step to verify. Requests still prefilling get none (nothing
to speculate on yet), and no request is offered more than it may still emit: a verifying step
adds up to k + 1 tokens, so the room is `max_tokens - num_output_tokens - 1`. A request with
structured outputs keeps only the longest prefix of its proposal that its grammar allows: a
proposal outside the grammar would be rejected anyway (the mask gives it probability 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nanovllm.request import Request
from nanovllm.spec_decode.draft_model_proposer import DraftModelProposer
from nanovllm.spec_decode.ngram_proposer import NgramProposer
from nanovllm.structured_output.manager import grammar_valid_prefix


def propose_next_tokens(
    proposer: NgramProposer | DraftModelProposer,
    running: Sequence[Request],
    block_table_of: Callable[[str], Sequence[int]],
) -> dict[str, list[int]]:
    """Every decoding request's proposal, by request id."""
    decoding = [r for r in running if r.num_computed_tokens == r.num_tokens - 1]
    rooms = [r.max_tokens - r.num_output_tokens - 1 for r in decoding]
    if isinstance(proposer, DraftModelProposer):
        tables = [block_table_of(r.request_id) for r in decoding]
        proposals = proposer.propose(decoding, tables, rooms)
    else:
        proposals = [proposer.propose(r.all_token_ids, n) for r, n in zip(decoding, rooms)]
    # (structured outputs: only the proposals its grammar allows, as vLLM does)
    return {
        request.request_id: grammar_valid_prefix(request, proposal)
        for request, proposal in zip(decoding, proposals)
    }
