"""`--run`'s check of what every engine run keeps (`compare.broken_invariant`), on a recorded run.

The oracle is the stock engine: its run of lesson 08's workload (blocks shared through the
prefix cache, given back and handed out again) keeps every invariant, and each kind of tampering with a copy of its
events breaks the one it should, named at the step where it happened.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from nanovllm.lessons import compare, your_engine
from nanovllm.lessons.catalog import get_lesson


@pytest.fixture(scope="module")
def stock_run(tmp_path_factory) -> list:
    lesson = get_lesson(8)
    return your_engine.record_stock(lesson, tmp_path_factory.mktemp("run") / "stock.jsonl")


def _index(events: list, kind: str, when=lambda e: True) -> int:
    return next(i for i, e in enumerate(events) if type(e).__name__ == kind and when(e))


def test_the_stock_run_keeps_every_invariant(stock_run):
    kinds = {type(e).__name__ for e in stock_run}
    assert {"CacheHit", "BlockFreed", "BlockAllocated"} <= kinds, "a run that tests them"
    assert compare.broken_invariant(stock_run) is None


def test_a_step_of_zero_tokens_is_named(stock_run):
    events = list(stock_run)
    i = _index(events, "StepSummary", lambda e: e.step == 3)
    events[i] = replace(events[i], scheduled={**events[i].scheduled, "r-extra": 0})
    assert compare.broken_invariant(events) == "at step 3: r-extra was scheduled with 0 tokens"


def test_a_block_never_given_back_is_named(stock_run):
    """A request's give-back left out: its block counts as held, so the count after the step
    is off by one, or the block, handed out again, is handed to two requests; the last
    give-back of the run left out: the block is still held after the run."""
    events = list(stock_run)
    i = _index(events, "BlockFreed")
    freed = events.pop(i)
    found = compare.broken_invariant(events)
    assert found is not None, "a block was never given back"
    assert "lost or made up" in found or f"block {freed.block_id} was handed to" in found, found
    events = list(stock_run)
    last = max(i for i, e in enumerate(events) if type(e).__name__ == "BlockFreed")
    freed = events.pop(last)
    found = compare.broken_invariant(events)
    assert found is not None, "the last block given back was never given back"
    assert "lost or made up" in found or (
        f"{freed.request_id} still holds block {freed.block_id}" in found
    ), found


def test_a_block_given_back_twice_or_handed_out_twice_is_named(stock_run):
    events = list(stock_run)
    i = _index(events, "BlockFreed")
    twice = [*events[: i + 1], events[i], *events[i + 1 :]]
    found = compare.broken_invariant(twice)
    assert found is not None and f"gave back block {events[i].block_id}, not its own" in found
    j = _index(events, "BlockAllocated")
    other = replace(events[j], request_id="someone-else")
    found = compare.broken_invariant([*events[: j + 1], other, *events[j + 1 :]])
    assert found is not None and f"block {events[j].block_id} was handed to someone-else" in found
