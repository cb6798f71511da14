"""Figures from runs: percentiles and agreement, step overhead, paged vs contiguous KV memory."""

from __future__ import annotations

import math

import pytest

from nanovllm.bench import analysis, stats
from nanovllm.bench.records import EngineRun, RequestRecord


def test_percentile_latency_and_agreement() -> None:
    assert stats.percentile([3, 1, 2, 4], 50) == 2.5
    assert math.isnan(stats.percentile([], 50))
    assert stats.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    run = EngineRun("x", 1.0, [RequestRecord([1, 2, 3], [0.5, 0.6, 0.8], arrival_s=0.25)])
    lat = stats.latency([run])
    assert lat["ttft"]["p50"] == 0.25 and lat["itl"]["p50"] == pytest.approx(0.15)
    assert run.output_tokens_per_s == 3.0
    ref = EngineRun("a", 1, [RequestRecord([1, 2, 3, 4], []), RequestRecord([5, 6], [])])
    other = EngineRun("b", 1, [RequestRecord([1, 2, 9, 4], []), RequestRecord([5, 6], [])])
    assert stats.agreement(ref, other) == {"tokens_pct": 100 * 4 / 6, "requests_pct": 50.0}


def _step(allocated: int, filled: int, running: int, **kw) -> dict:
    base = dict(wall=1.0, schedule=0.0, prepare=0.0, model=0.0, sample=0.0, num_tokens=running,
                num_prefill_tokens=0, num_seqs=running, num_running=running,
                allocated_slots=allocated, filled_slots=filled)  # fmt: skip
    return {**base, **kw}


def test_step_breakdown_by_hand() -> None:
    steps = [
        _step(0, 0, 4, wall=10.0, schedule=1.0, prepare=1.0, model=7.0, sample=0.5),
        _step(0, 0, 4, wall=10.0, schedule=0.0, prepare=1.0, model=8.0, sample=0.5),
    ]
    b = analysis.step_breakdown(steps)
    assert b["overhead_share"] == pytest.approx(0.25)  # 5 s of 20 outside the model
    assert b["share"]["other"] == pytest.approx(1.0 / 20)
    assert sum(b["share"].values()) == pytest.approx(1.0)
    o = analysis.overhead(steps + [_step(0, 0, 4, num_prefill_tokens=5)], full_concurrency=4)
    assert o["at_full_concurrency"]["num_steps"] == 2  # the step with a prefill is not a decode


def test_memory_by_hand() -> None:
    # Three steps (allocated, filled, running): (32, 20, 2), (96, 69, 3), (48, 47, 1).
    steps = [_step(32, 20, 2), _step(96, 69, 3), _step(48, 47, 1)]
    # (prompt, output) -> KV tokens at the longest -> paged slots, blocks of 16:
    # (10, 7) -> 16 -> 16 and (30, 3) -> 32 -> 32: a mean of 24 slots a request.
    mem = analysis.memory(steps, [(10, 7), (30, 3)], 1024, block_size=16, max_model_len=256)
    assert mem["fragmentation"] == pytest.approx(1 - 136 / 176)
    assert (mem["peak_running"], mem["peak_allocated_slots"], mem["peak_filled_slots"]) == (
        3,
        96,
        69,
    )
    assert mem["peak_contiguous_slots"] == 3 * 256
    assert (mem["fit_paged"], mem["fit_contiguous"]) == (1024 // 24, 1024 // 256)
    assert analysis.paged_slots(16, 16) == 16 and analysis.paged_slots(17, 16) == 32
