"""Helpers shared by the visualizer's app tests."""

from __future__ import annotations

import time
from collections.abc import Callable


async def wait_until(pilot, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let the app run until `predicate()` holds (the worker is a real thread), then settle."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.pause()


def engine_started(num_blocks: int = 4):
    from nanovllm.events import EngineStarted

    return EngineStarted("synthetic", num_blocks, 4, 4, 16, 64, True, True, "torch")


def step_events(step: int, num_blocks: int = 4) -> list:
    """Step `step` of a cheap, consistent run: one request arrives, takes the head of the free
    queue for its prompt, is prefilled, samples one token and finishes, and its block goes
    back to the tail."""
    from nanovllm.events import (
        BlockAllocated,
        BlockFreed,
        RequestAdded,
        RequestFinished,
        RequestScheduled,
        StepSummary,
        TokenEmitted,
    )

    rid, block = f"r{step}", (step - 1) % num_blocks  # the head of the free queue
    return [
        RequestAdded(rid, "abc", 3, 1, ("a", "b", "c")),
        BlockAllocated(rid, block, 0),
        RequestScheduled(step, rid, 3, 0, True, False),
        TokenEmitted(step, rid, 7, "d", 1),
        RequestFinished(step, rid, "length", 3, 1),
        BlockFreed(rid, block, 0, False),
        StepSummary(step, {rid: 3}, 3, 0, 0, 0, 0, 0, num_blocks, 0, 0, 1e-4, 1e-3),
    ]


def long_trace(num_steps: int, num_blocks: int = 4) -> list:
    """`num_steps` steps of `step_events`, after `EngineStarted`: for runs longer than the
    history (`MAX_HISTORY` steps)."""
    events = [engine_started(num_blocks)]
    for step in range(1, num_steps + 1):
        events += step_events(step, num_blocks)
    return events
