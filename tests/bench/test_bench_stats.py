"""Percentiles, repeat summaries, latency and greedy agreement."""

from __future__ import annotations

import math

import pytest

from nanovllm.bench import stats
from nanovllm.bench.records import EngineRun, RequestRecord


def test_percentile_and_summary() -> None:
    assert stats.percentile([3, 1, 2, 4], 50) == 2.5
    assert stats.percentile([5], 99) == 5
    assert math.isnan(stats.percentile([], 50))
    assert stats.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def test_latency_from_token_times() -> None:
    run = EngineRun("x", 1.0, [RequestRecord([1, 2, 3], [0.5, 0.6, 0.8], arrival_s=0.25)])
    assert run.records[0].ttft == 0.25
    assert run.records[0].itls == pytest.approx([0.1, 0.2])
    lat = stats.latency([run])
    assert lat["ttft"]["p50"] == 0.25
    assert lat["itl"]["p50"] == pytest.approx(0.15)
    assert run.output_tokens_per_s == 3.0


def test_agreement_counts_the_common_prefix() -> None:
    ref = EngineRun("a", 1, [RequestRecord([1, 2, 3, 4], []), RequestRecord([5, 6], [])])
    other = EngineRun("b", 1, [RequestRecord([1, 2, 9, 4], []), RequestRecord([5, 6], [])])
    a = stats.agreement(ref, other)
    assert a["tokens_pct"] == pytest.approx(100 * 4 / 6)  # 2 of 4, then 2 of 2
    assert a["requests_pct"] == 50.0
    assert stats.agreement(ref, ref)["tokens_pct"] == 100.0
