"""The `StepSummary` event: a step that ran, as the scheduler and the KV cache manager left it.

What the step scheduled (tokens per request, prefill and decode), the queues and the KV cache's
block and slot counts after it, why the waiting requests wait (`waiting_reasons.py`), and its
times. The engine makes one after every step, only while someone subscribes to events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nanovllm.core.kv_cache_usage import num_allocated_slots, num_filled_slots
from nanovllm.core.waiting_reasons import budget_cut, waiting_reason
from nanovllm.events import StepSummary

if TYPE_CHECKING:
    from nanovllm.core.kv_cache_manager import KVCacheManager
    from nanovllm.core.scheduler import Scheduler, SchedulerOutput


def step_summary(
    scheduler: Scheduler,
    kv: KVCacheManager,
    sched: SchedulerOutput,
    forward_time: float,
    rank_forward_times: Sequence[float],
) -> StepSummary:
    """The `StepSummary` of `sched`, just run (`forward_time`: its forward pass and sampling;
    `rank_forward_times`: each rank's forward pass)."""
    scheduled = {s.request.request_id: s.num_new_tokens for s in sched.scheduled}
    reason, head = waiting_reason(scheduler, sched)
    num_decode = sum(s.num_new_tokens for s in sched.scheduled if not s.is_prefill)
    return StepSummary(
        step=sched.step,
        scheduled=scheduled,
        num_prefill_tokens=sched.num_scheduled_tokens - num_decode,
        num_decode_tokens=num_decode,
        num_running=len(scheduler.running),
        num_waiting=scheduler.num_waiting,
        num_used_blocks=kv.num_used_blocks,
        num_cached_free_blocks=kv.block_pool.num_cached_free_blocks,
        num_free_blocks=kv.num_free_blocks,
        num_allocated_slots=num_allocated_slots(kv),
        num_filled_slots=num_filled_slots(kv),
        schedule_time=sched.schedule_time,
        forward_time=forward_time,
        num_preempted=len(sched.preempted),
        token_budget=scheduler.max_num_batched_tokens,
        free_queue_head=tuple(kv.free_block_queue.peek(8)),
        rank_forward_times=tuple(rank_forward_times),
        waiting_reason=reason,
        waiting_head=head,
        budget_cut=budget_cut(sched),
        waiting_blocks_needed=sched.waiting_blocks[0] if sched.waiting_blocks else None,
        waiting_free_blocks=sched.waiting_blocks[1] if sched.waiting_blocks else None,
    )
