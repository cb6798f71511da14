"""Lesson 07 reference: the engine's `Scheduler.schedule()` with a finite KV cache.

`sim.schedule_with_engine` replays the state into a fresh engine scheduler whose KV cache has
`num_blocks` blocks (each running request first allocates the blocks of its computed tokens),
runs one `schedule()`, and writes back admissions and preemptions.
"""

from __future__ import annotations

from nanovllm.lessons.sim import Req, StepPlan, schedule_with_engine

__all__ = ["schedule_step"]


def schedule_step(
    running: list[Req],
    waiting: list[Req],
    *,
    max_num_seqs: int,
    token_budget: int,
    num_blocks: int,
    block_size: int,
) -> StepPlan:
    return schedule_with_engine(
        running,
        waiting,
        max_num_seqs=max_num_seqs,
        token_budget=token_budget,
        num_blocks=num_blocks,
        block_size=block_size,
    )
