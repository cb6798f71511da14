"""Lesson 11 exercise: the arithmetic of a benchmark, and the framing of a stream.

Check with `nanovllm lesson 11 --check`.
"""

from __future__ import annotations

import json  # noqa: F401  (yours to use)
import math  # noqa: F401
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of `values`, NumPy's default ("linear") method.

    Sort the values; the percentile sits at position pos = (n - 1) * q / 100. When pos is not a
    whole number, interpolate linearly between the values at floor(pos) and ceil(pos).
    Return NaN (math.nan) for an empty sequence.
    """
    raise NotImplementedError("write percentile (lesson 11)")


def ttft(arrival_s: float, token_times: Sequence[float]) -> float | None:
    """Time to first token: from the request's arrival to its first token (None if no tokens).
    All times are in seconds on the same clock."""
    raise NotImplementedError("write ttft (lesson 11)")


def inter_token_latencies(token_times: Sequence[float]) -> list[float]:
    """The gaps between consecutive tokens of one request: n - 1 of them for n tokens (the
    first token's wait belongs to TTFT, not here)."""
    raise NotImplementedError("write inter_token_latencies (lesson 11)")


def sse_event(payload: dict[str, Any]) -> str:
    """One server-sent event carrying `payload` as JSON: "data: <json>" and a blank line.

    The JSON must be on one line (a raw newline would end the event early): json.dumps without
    indentation escapes the newlines inside strings. Keep non-ASCII text as it is
    (ensure_ascii=False) and compact separators are welcome.
    """
    raise NotImplementedError("write sse_event (lesson 11)")
