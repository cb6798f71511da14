"""Numbers from runs: percentiles, median and range over repeats, latency and agreement.

Repeats are summarized by their median and min-max, not the mean: one run slowed by a noisy
neighbour should not move the headline. Latency percentiles pool every request of every repeat.
Greedy agreement compares an engine's tokens with nanovllm's, request by request: the share of
asked-for tokens that match before the first difference. In fp32 two correct engines can still
part ways where the top two logits tie to rounding, so it is a percentage, not a pass/fail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nanovllm.bench.records import EngineRun


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of per-repeat figures."""
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "median": percentile(values, 50),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def _pooled(runs: Sequence[EngineRun]) -> tuple[list[float], list[float]]:
    ttfts = [r.ttft for run in runs for r in run.records if r.ttft is not None]
    return ttfts, [x for run in runs for r in run.records for x in r.itls]


def latency(runs: Sequence[EngineRun]) -> dict[str, dict[str, float]]:
    """TTFT and inter-token latency percentiles (seconds), pooled over runs."""
    ttfts, itls = _pooled(runs)
    qs = (50, 90, 99)
    return {
        "ttft": {f"p{q}": percentile(ttfts, q) for q in qs},
        "itl": {f"p{q}": percentile(itls, q) for q in qs},
    }


def cdf(runs: Sequence[EngineRun], points: int = 101) -> dict[str, list[float]]:
    """TTFT and ITL at evenly spaced percentiles, for the plot."""
    ttfts, itls = _pooled(runs)
    qs = [100.0 * i / (points - 1) for i in range(points)]
    return {
        "q": qs,
        "ttft": [percentile(ttfts, q) for q in qs] if ttfts else [],
        "itl": [percentile(itls, q) for q in qs] if itls else [],
    }


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def agreement(reference: EngineRun, other: EngineRun) -> dict[str, float]:
    """How far `other`'s greedy outputs follow `reference`'s (percentages)."""
    matched = asked = identical = 0
    for ref, rec in zip(reference.records, other.records):
        matched += common_prefix(ref.token_ids, rec.token_ids)
        asked += max(len(ref.token_ids), len(rec.token_ids))
        identical += ref.token_ids == rec.token_ids
    return {
        "tokens_pct": 100.0 * matched / asked if asked else 100.0,
        "requests_pct": 100.0 * identical / max(len(reference.records), 1),
    }
