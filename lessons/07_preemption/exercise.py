"""Lesson 07 exercise: a scheduler step with a finite KV cache, and preemption.

Start from your lesson 06 `schedule_step` (passing lesson 06 copies it in below, if this file is
still untouched). `Req` is the scheduler's view of a request; the helpers
from `nanovllm.lessons.sim`: `blocks_for(num_tokens, block_size)` is ceil(num_tokens /
block_size), and `StepPlan(scheduled, preempted)` is what a step returns. Check with
`nanovllm lesson 7 --check`.
"""

from __future__ import annotations

from nanovllm.lessons.sim import Req, StepPlan, blocks_for  # noqa: F401  (yours to use)


def schedule_step(
    running: list[Req],
    waiting: list[Req],
    *,
    max_num_seqs: int,
    token_budget: int,
    num_blocks: int,
    block_size: int,
) -> StepPlan:
    """One step of continuous batching with `num_blocks` KV blocks of `block_size` tokens.

    Between steps a running request holds `blocks_for(r.num_computed, block_size)` blocks; a
    waiting one holds none. Free blocks = num_blocks - the blocks held by `running`.

    1. Running requests, oldest first, while budget is left: n = min(r.remaining, budget left).
       The request needs `blocks_for(r.num_computed + n) - blocks_for(r.num_computed)` more
       blocks. While that is more than the free blocks, preempt the NEWEST running request
       (`running.pop()`): its blocks become free, its `num_computed` becomes 0, it goes to the
       FRONT of `waiting` (`waiting.insert(0, victim)`; several victims keep their original
       order), and its id is appended to `preempted`. If the victim is the request itself, stop
       the running loop. Otherwise schedule it: n tokens, its new blocks are no longer free.
    2. Only if nobody was preempted: admit from the front of `waiting` as in lesson 06 (budget,
       seats, first come first served, whole prompt of `num_tokens`), and also only if
       `blocks_for(num_tokens)` blocks are free; if not, stop admitting.

    Return StepPlan(scheduled={id: tokens} in scheduling order, preempted=[ids in the order
    preempted]). Change no `num_computed` except to reset a victim's to 0.
    """
    raise NotImplementedError("write schedule_step (lesson 07)")
