"""The load generator (`nanovllm bench --serve` measures with it) against a live server."""

from __future__ import annotations

import pytest
from serve_support import PROMPTS

from nanovllm.serve.load import Percentiles, percentile, run_load_sync


def test_percentile_interpolates_like_numpy():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    p = Percentiles.of([3.0, 1.0, 2.0])
    assert (p.p50, p.max, p.count, p.mean) == (2.0, 3.0, 3, 2.0)


def test_load_against_the_server(server):
    report = run_load_sync(server.url, PROMPTS, concurrency=8, num_requests=16, max_tokens=12)
    assert report.num_ok == 16 and report.num_errors == 0, report.errors
    assert report.output_tokens == 16 * 12
    assert report.prompt_tokens == sum(len(p) for p in PROMPTS)
    assert report.ttft.count == 16
    for p in (report.ttft, report.itl, report.tpot, report.latency):
        assert 0 <= p.p50 <= p.p90 <= p.p99 <= p.max
    assert report.latency.p50 >= report.ttft.p50
    assert report.output_throughput > 0 and report.request_throughput > 0
    assert "TTFT" in report.format() and report.as_dict()["num_ok"] == 16


def test_load_chat_and_errors_are_counted(chat_server, server):
    report = run_load_sync(
        chat_server.url, ["Hello there"], concurrency=2, num_requests=3, max_tokens=4, chat=True
    )
    assert report.num_ok == 3 and report.output_tokens == 12
    # The other app has no chat template: every request fails, and the run still reports.
    failed = run_load_sync(server.url, ["Hi"], concurrency=2, num_requests=2, chat=True)
    assert failed.num_ok == 0 and failed.num_errors == 2
    assert "chat template" in failed.errors[0]
