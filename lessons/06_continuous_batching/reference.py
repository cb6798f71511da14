"""Lesson 06 reference: the engine's `Scheduler.schedule()`, on the simplified state.

`sim.schedule_with_engine` replays the two lists into a fresh engine scheduler (with plenty of KV
blocks, prefix caching and chunked prefill off), runs one `schedule()`, and writes the result back.
"""

from __future__ import annotations

from nanovllm.lessons.sim import Req, schedule_with_engine

__all__ = ["schedule_step"]


def schedule_step(
    running: list[Req], waiting: list[Req], max_num_seqs: int, token_budget: int
) -> dict[str, int]:
    plan = schedule_with_engine(
        running, waiting, max_num_seqs=max_num_seqs, token_budget=token_budget
    )
    return plan.scheduled
