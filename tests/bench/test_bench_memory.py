"""Paged vs contiguous KV arithmetic, against an example worked out by hand."""

from __future__ import annotations

import pytest

from nanovllm.bench import analysis
from nanovllm.bench.memory import (
    kv_slots_needed,
    paged_slots,
    requests_that_fit,
    snapshot,
    time_weighted_fragmentation,
)


def test_slots_a_request_needs() -> None:
    # 10 prompt tokens + 5 outputs: the 5th output is never fed back, so 14 tokens of KV.
    assert kv_slots_needed(10, 5) == 14
    assert paged_slots(14, 16) == 16
    assert paged_slots(16, 16) == 16
    assert paged_slots(17, 16) == 32
    assert paged_slots(0, 16) == 0


def test_snapshot_by_hand() -> None:
    # Three requests holding 20, 33 and 16 tokens, blocks of 16, max_model_len 1024:
    #   paged:      2 + 3 + 1 = 6 blocks = 96 slots; 69 hold KV; 27 empty = 28.125 %
    #   contiguous: 3 x 1024 = 3072 slots; 3003 empty = 97.75...%
    s = snapshot([20, 33, 16], block_size=16, max_model_len=1024)
    assert (s.filled_slots, s.paged_slots, s.contiguous_slots) == (69, 96, 3072)
    assert s.fragmentation == pytest.approx(27 / 96)
    assert s.contiguous_waste == pytest.approx(3003 / 3072)


def test_requests_that_fit_by_hand() -> None:
    # (prompt, output) -> KV slots -> paged slots (B=16): (10, 7) -> 16 -> 16,
    # (30, 3) -> 32 -> 32, (40, 9) -> 48 -> 48. Mean 32 slots.
    # 1024 slots: contiguous at max_model_len 256 -> 4 requests; paged 1024 / 32 -> 32.
    fit = requests_that_fit([(10, 7), (30, 3), (40, 9)], 1024, block_size=16, max_model_len=256)
    assert fit.paged_mean_slots == 32
    assert (fit.contiguous, fit.paged) == (4, 32)
    assert fit.ratio == 8


def test_time_weighted_fragmentation() -> None:
    # Steps with (allocated, filled) (32, 20), (48, 40), (0, 0): 20 empty of 80 slot-steps.
    assert time_weighted_fragmentation([32, 48, 0], [20, 40, 0]) == pytest.approx(0.25)
    assert time_weighted_fragmentation([], []) == 0.0


def _step(allocated: int, filled: int, running: int, **kw) -> dict:
    base = dict(
        t_end=0.0, wall=1.0, schedule=0.0, prepare=0.0, model=0.0, sample=0.0, num_tokens=running,
        num_prefill_tokens=0, num_seqs=running, num_sampled=running, num_running=running,
        num_waiting=0, allocated_slots=allocated, filled_slots=filled,
    )  # fmt: skip
    return {**base, **kw}


def test_memory_report_from_steps() -> None:
    steps = [_step(32, 20, 2), _step(96, 69, 3), _step(48, 47, 1)]
    mem = analysis.memory(steps, [(10, 7), (30, 3)], num_kv_blocks=64, block_size=16,
                          max_model_len=1024)  # fmt: skip
    assert mem["capacity_slots"] == 1024
    assert mem["fragmentation_time_weighted"] == pytest.approx(1 - 136 / 176)
    peak = mem["at_peak"]
    assert (peak["num_running"], peak["allocated_slots"], peak["contiguous_slots"]) == (3, 96, 3072)
    assert peak["paged_vs_contiguous"] == pytest.approx(96 / 3072)
    assert (mem["fit_contiguous"], mem["fit_paged"]) == (1, 42)  # 1024 // 24 (mean of 16, 32)


def test_step_breakdown_shares() -> None:
    steps = [
        _step(0, 0, 4, wall=10.0, schedule=1.0, prepare=1.0, model=7.0, sample=0.5),
        _step(0, 0, 4, wall=10.0, schedule=0.0, prepare=1.0, model=8.0, sample=0.5),
    ]
    b = analysis.step_breakdown(steps)
    assert b["overhead_share"] == pytest.approx(0.25)
    assert b["seconds"]["other"] == pytest.approx(1.0)
    o = analysis.overhead(steps + [_step(0, 0, 2, num_prefill_tokens=5)], full_concurrency=4)
    assert o["at_full_concurrency"]["num_steps"] == 2
