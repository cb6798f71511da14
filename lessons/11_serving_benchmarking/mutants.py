"""Lesson 11 planted bugs: wrong percentiles, misattributed latencies, broken framing."""

from __future__ import annotations

import json
import math

from nanovllm.lessons.testing import Mutant, variant


def _percentile(values, q, *, bug=""):
    if not values:
        return math.nan
    xs = list(values) if bug == "percentile-unsorted" else sorted(values)
    if bug == "percentile-sorts-in-place":
        values.sort()  # the caller's list, reordered
        xs = values
    pos = (len(xs) - 1) * q / 100
    if bug == "percentile-nearest-rank":
        return xs[round(pos)]
    if bug == "percentile-floor":
        return xs[math.floor(pos)]
    lo, hi = math.floor(pos), math.ceil(pos)
    if bug == "learner-weight-is-q":
        return xs[lo] + (xs[hi] - xs[lo]) * q / 100  # right for two values only
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _p(name, description):
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, percentile=lambda v, q: _percentile(v, q, bug=name)),
    )


MUTANTS = [
    _p("percentile-unsorted", "the values are not sorted first"),
    _p("percentile-nearest-rank", "rounds to the nearest rank instead of interpolating"),
    _p("percentile-floor", "takes the lower neighbour instead of interpolating"),
    _p("percentile-sorts-in-place", "sorts the caller's list (values.sort()), not a copy"),
    Mutant(
        "ttft-to-last-token",
        "TTFT measured to the last token (that is the whole latency)",
        lambda ref: variant(ref, ttft=lambda a, t: t[-1] - a if t else None),
    ),
    Mutant(
        "itl-includes-first-wait",
        "the inter-token gaps start from time 0, counting the first token's wait",
        lambda ref: variant(
            ref, inter_token_latencies=lambda t: [b - a for a, b in zip([0.0, *t], t)]
        ),
    ),
    Mutant(
        "sse-single-newline",
        "an event ends with one newline, not a blank line",
        lambda ref: variant(ref, sse_event=lambda p: f"data: {json.dumps(p)}\n"),
    ),
    Mutant(
        "sse-pretty-json",
        "the JSON is indented: its newlines split the event",
        lambda ref: variant(ref, sse_event=lambda p: f"data: {json.dumps(p, indent=1)}\n\n"),
    ),
    # Learner mistakes: wrong solutions written as a learner writes them (issue #52).
    _p("learner-weight-is-q", "interpolates with weight q / 100 instead of pos - floor(pos)"),
]
