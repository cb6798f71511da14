"""Why the waiting requests wait: the scheduler's reason for admitting no more this step.

The scheduler admits waiting requests in arrival order (`scheduler.py`, step 2) and stops at
the first one it cannot take; every request behind that one waits too, in order. It stops for
one of four reasons, checked in the scheduler's own order:

- `preempted`: it preempted a running request this step (memory is tight: nobody is admitted);
- `token_budget`: the step's token budget is spent (or, without chunked prefill, the head's
  prompt does not fit in what is left of it: the scheduler marks that case on its output);
- `max_num_seqs`: `max_num_seqs` requests already run;
- `no_free_block`: the KV cache manager could not give the head's tokens their blocks.

A running or admitted request whose step is a prefill chunk that stops short of its prompt's end
got fewer tokens than it needs: the token budget cut it (`budget_cut`).

These are read off the step's `SchedulerOutput` and the scheduler after the step, only while
someone subscribes to events (`step_summary.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanovllm.request import RequestStatus

if TYPE_CHECKING:
    from nanovllm.core.scheduler import Scheduler, SchedulerOutput


def waiting_head(scheduler: Scheduler) -> str | None:
    """The first live request of the waiting queue (aborted ones are dropped lazily)."""
    for request in scheduler.waiting:
        if request.status != RequestStatus.FINISHED:
            return request.request_id
    return None


def waiting_reason(scheduler: Scheduler, out: SchedulerOutput) -> tuple[str | None, str | None]:
    """(reason, head): why the scheduler admitted nobody more in step `out`, and the request it
    stopped at; (None, None) when nobody waits."""
    head = waiting_head(scheduler)
    if head is None:
        return None, None
    if out.preempted:
        return "preempted", head
    if out.num_scheduled_tokens >= scheduler.max_num_batched_tokens:
        return "token_budget", head
    # The budget was not spent, so every running request was scheduled: they are the step's
    # requests that were running (or admitted) when admission stopped.
    if len(out.scheduled) >= scheduler.max_num_seqs:
        return "max_num_seqs", head
    return out.waiting_reason or "no_free_block", head


def budget_cut(out: SchedulerOutput) -> dict[str, int]:
    """Request id -> tokens it still needed, for each request the token budget cut to a chunk."""
    return {
        s.request.request_id: s.request.num_tokens - s.num_computed_tokens
        for s in out.scheduled
        if not s.samples
    }
