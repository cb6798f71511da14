"""Lesson 11 properties: percentiles, latencies, and server-sent event framing."""

from __future__ import annotations

import json
import math

from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.lessons.testing import lesson_settings, show_inputs

values = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30)
qs = st.floats(0, 100)


@lesson_settings(40)
@given(xs=values, q=qs, data=st.data())
@show_inputs
def test_percentile_is_an_order_statistic(impl, xs, q, data):
    """A percentile lies between the minimum and maximum, ignores order, and grows with q; the
    caller's list is left as it was (sort a copy: `sorted(values)`, not `values.sort()`)."""
    given_order = list(xs)
    p = impl.percentile(xs, q)
    assert xs == given_order, (
        f"percentile reordered the caller's list (to {xs}; the input above is as it was): sort "
        "a copy, sorted(values), not values.sort()"
    )
    assert min(xs) <= p <= max(xs), f"percentile {p} outside [{min(xs)}, {max(xs)}]"
    assert impl.percentile(xs, 0) == min(xs), "the 0th percentile is the minimum"
    assert impl.percentile(xs, 100) == max(xs), "the 100th percentile is the maximum"
    shuffled = data.draw(st.permutations(xs), label="same values, another order")
    assert impl.percentile(shuffled, q) == p, "the order of the values must not matter"
    q2 = data.draw(st.floats(q, 100), label="a higher q")
    assert impl.percentile(xs, q2) >= p - 1e-9 * max(1.0, abs(p)), "percentiles grow with q"


@lesson_settings(40)
@example(a=1.0, b=2.0, q=50.0)
@given(a=st.floats(-1e3, 1e3), b=st.floats(-1e3, 1e3), q=qs)
@show_inputs
def test_percentile_interpolates_linearly(impl, a, b, q):
    """Between two values, the q-th percentile is linear interpolation (NumPy's default); the
    caller's list keeps its order."""
    lo, hi = sorted((a, b))
    expected = lo + (hi - lo) * q / 100
    backwards = [hi, lo]
    impl.percentile(backwards, q)
    assert backwards == [hi, lo], (
        f"percentile([{hi}, {lo}], {q}) reordered the caller's list to {backwards}: sort a copy, "
        "sorted(values), not values.sort()"
    )
    assert math.isclose(impl.percentile([a, b], q), expected, rel_tol=1e-9, abs_tol=1e-9), (
        f"between {lo} and {hi}, the {q}th percentile is {expected}"
    )
    assert impl.percentile([a, a, b, b, b], 50) == b, "the median of 5 values is the 3rd smallest"


@lesson_settings(5)
@given(q=qs)
@show_inputs
def test_percentile_of_nothing_is_nan(impl, q):
    """The percentile of no values is NaN."""
    assert math.isnan(impl.percentile([], q))


times = st.lists(st.floats(0, 1e4, allow_nan=False), max_size=20).map(sorted)


@lesson_settings(50)
@given(arrival=st.floats(0, 1e4), token_times=times)
@show_inputs
def test_latencies_add_up(impl, arrival, token_times):
    """TTFT is arrival to first token; the n - 1 gaps between n tokens add up to the last token's
    time."""
    first = impl.ttft(arrival, token_times)
    gaps = list(impl.inter_token_latencies(token_times))
    if not token_times:
        assert first is None, "no tokens, no time to first token"
        assert gaps == []
        return
    assert math.isclose(first, token_times[0] - arrival, abs_tol=1e-9), (
        "TTFT: arrival to first token"
    )
    assert len(gaps) == len(token_times) - 1, "n tokens have n - 1 gaps between them"
    assert all(g >= 0 for g in gaps)
    assert math.isclose(arrival + first + sum(gaps), token_times[-1], rel_tol=1e-9, abs_tol=1e-6), (
        "arrival + TTFT + every gap must reach the last token's time"
    )


payloads = st.dictionaries(
    st.text(max_size=8),
    st.one_of(
        st.text(max_size=20), st.integers(), st.none(), st.lists(st.text(max_size=5), max_size=3)
    ),
    max_size=5,
)


@lesson_settings(40)
@given(payload=payloads)
@show_inputs
def test_an_sse_event_is_exactly_one_event(impl, payload):
    """An SSE event is 'data: <json>' and a blank line, with no raw newline inside, carrying the
    payload."""
    event = impl.sse_event(payload)
    assert event.startswith("data: "), "an event's line starts with 'data: '"
    assert event.endswith("\n\n"), "an event ends with a blank line"
    body = event[len("data: ") : -2]
    assert "\n" not in body and "\r" not in body, "a raw newline inside would end the event early"
    assert json.loads(body) == payload, "the data must be the payload, as JSON"
