"""Lesson 11 reference: nanovllm's benchmark statistics and its server's SSE framing.

`ttft` and `inter_token_latencies` are the properties of the benchmark's `RequestRecord`;
`percentile` is `bench.stats.percentile`; `sse_event` is `serve.sse.sse_data`.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanovllm.bench.records import RequestRecord
from nanovllm.bench.stats import percentile
from nanovllm.serve.sse import sse_data as sse_event

__all__ = ["percentile", "ttft", "inter_token_latencies", "sse_event"]


def ttft(arrival_s: float, token_times: Sequence[float]) -> float | None:
    return RequestRecord([0] * len(token_times), list(token_times), arrival_s).ttft


def inter_token_latencies(token_times: Sequence[float]) -> list[float]:
    return RequestRecord([0] * len(token_times), list(token_times)).itls
