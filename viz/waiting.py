"""Why a waiting request waits, and why a request got fewer tokens than it needs.

The scheduler says it (`nanovllm/core/waiting_reasons.py`), in each step's `StepSummary`: the
reason it admitted nobody more (`max_num_seqs` requests already run, no free KV block for the
head's tokens, the token budget spent, or a preemption this step) and the request it stopped
at, the head of the waiting queue. Admission is first come, first served, so every request
behind the head waits for the same reason, behind it. A preempted request also says so (it
lost its blocks and recomputes from its prompt when it is admitted again). A request that
arrived after the last step has not been considered yet.

"No free block" was true when the scheduler decided, before the step ran; requests that finish
in the step free their blocks after it, so the free count after the step can be more than the
head needed. The summary carries both counts and `blocks_words` says which is which.

`budget_cut` in the same summary names the requests whose step was a chunk: the token budget
gave them fewer tokens than they needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanovllm.events import WAITING_REASONS, StepSummary

if TYPE_CHECKING:
    from nanovllm.viz.whole_state import WholeState

# A few characters each, for a queue line.
SHORT = {
    "max_num_seqs": "seqs",
    "no_free_block": "block",
    "token_budget": "budget",
    "preempted": "preempt",
}
NEW = "new"  # arrived after the last step: the next step decides


def why_waiting(state: WholeState, request_id: str) -> tuple[str, str] | None:
    """(short, in words) for a waiting request; None when it does not wait."""
    if request_id not in state.waiting:
        return None
    info = state.requests.get(request_id)
    preempted = info is not None and info.num_preemptions > 0
    if request_id in state.draft.preempted:  # this very step (the summary is still to come)
        return SHORT["preempted"], "preempted this step: it lost its blocks, nobody is admitted"
    reason, head = state.waiting_reason, state.waiting_head
    if reason is None or head not in state.waiting:
        return NEW, "arrived after the last step: the next step decides"
    words = WAITING_REASONS.get(reason, reason)
    short = SHORT.get(reason, reason)
    if request_id != head:
        ahead = state.waiting.index(request_id) - state.waiting.index(head)
        if ahead > 0:
            words = f"behind {head} ({ahead} ahead, first come first served): {words}"
    summary = state.last_step.summary if state.last_step else None
    if summary is not None and summary.waiting_reason == reason:
        words += blocks_words(summary)
    if preempted:
        words = f"preempted ×{info.num_preemptions}, recomputes from its prompt; {words}"
    return short, words


def budget_cut(state: WholeState) -> dict[str, int]:
    """Request id -> tokens it needed, for each request the last step's budget cut to a chunk."""
    summary = state.last_step.summary if state.last_step else None
    return dict(summary.budget_cut) if summary is not None else {}


def blocks_words(summary: StepSummary) -> str:
    """` (when the scheduler decided: 2 free, 5 needed; after the step: 12 free)` for a head
    that found no free block; "" for any other reason, or a trace without the counts."""
    needed, free = summary.waiting_blocks_needed, summary.waiting_free_blocks
    if summary.waiting_reason != "no_free_block" or needed is None or free is None:
        return ""
    return (
        f" (when the scheduler decided: {free} free, {needed} needed; "
        f"after the step: {summary.num_free_blocks} free)"
    )
