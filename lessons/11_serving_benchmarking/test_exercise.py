"""Lesson 11 properties: percentiles, latencies, and server-sent event framing."""

from __future__ import annotations

import copy
import json
import math
from fractions import Fraction

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


# Any magnitude: huge, ordinary, tiny (subnormal), with ties and all-equal lists, 1 to 40 values.
magnitudes = st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False)
any_values = st.one_of(
    st.lists(magnitudes, min_size=1, max_size=40),
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=40),
    st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=40),  # many ties
    st.tuples(magnitudes, st.integers(1, 40)).map(lambda xn: [xn[0]] * xn[1]),  # all equal
)
any_qs = st.one_of(qs, st.integers(0, 100).map(float))


def _linear_percentile(values: list[float], q: float) -> Fraction:
    """The oracle, in exact arithmetic: position (n - 1) * q / 100 of the sorted values,
    linear between the two values around it."""
    xs = sorted(values)
    pos = (len(xs) - 1) * Fraction(q) / 100
    lo = int(pos)  # pos >= 0: int() is floor()
    hi = min(lo + 1, len(xs) - 1)
    return Fraction(xs[lo]) + (Fraction(xs[hi]) - Fraction(xs[lo])) * (pos - lo)


@lesson_settings(40)
@given(xs=any_values, q=any_qs)
@show_inputs
def test_percentile_is_numpys_linear_method(impl, xs, q):
    """For any number of values of any size, the q-th percentile is (to float rounding) the
    value at position (n - 1) * q / 100 of the sorted values, linear between the two around it;
    the caller's list is left as it was."""
    given = list(xs)
    expected = _linear_percentile(given, q)
    p = impl.percentile(xs, q)
    assert xs == given, "percentile changed the caller's list: sort a copy, sorted(values)"
    # Float rounding, relative to the two values the percentile lies between.
    pos = (len(given) - 1) * Fraction(q) / 100
    lo, hi = int(pos), min(int(pos) + 1, len(given) - 1)
    around = [abs(Fraction(x)) for x in sorted(given)[lo : hi + 1]]
    tol = Fraction(1e-12) * max(around) + Fraction(1e-300) * Fraction(1e-20)
    assert abs(Fraction(p) - expected) <= tol, (
        f"percentile({len(xs)} values, {q}) = {p!r}; the linear method gives "
        f"{float(expected)!r} (position (n - 1) * q / 100 = {float((len(xs) - 1) * Fraction(q) / 100)!r})"
    )


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
    given = list(token_times)
    first = impl.ttft(arrival, token_times)
    assert token_times == given, "ttft changed the caller's token_times"
    gaps = list(impl.inter_token_latencies(token_times))
    assert token_times == given, "inter_token_latencies changed the caller's token_times"
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


# Text with non-ASCII characters often: "é", "☕", "😀" must reach the client as they are.
texts = st.text(alphabet=st.sampled_from('ab \n"é☕😀€'), max_size=8) | st.text(max_size=8)
payloads = st.dictionaries(
    texts,
    st.one_of(texts, st.integers(), st.none(), st.lists(texts, max_size=3)),
    max_size=5,
)


@lesson_settings(40)
@given(payload=payloads)
@show_inputs
def test_an_sse_event_is_exactly_one_event(impl, payload):
    """An SSE event is 'data: <json>' and a blank line, with no raw newline inside, carrying the
    payload."""
    given = copy.deepcopy(payload)
    event = impl.sse_event(payload)
    assert payload == given, "sse_event changed the payload it was given"
    assert event.startswith("data: "), "an event's line starts with 'data: '"
    assert event.endswith("\n\n"), "an event ends with a blank line"
    body = event[len("data: ") : -2]
    assert "\n" not in body and "\r" not in body, "a raw newline inside would end the event early"
    assert json.loads(body) == payload, "the data must be the payload, as JSON"
    kept = [c for text in _texts(payload) for c in text if ord(c) > 127]
    assert all(c in body for c in kept), (
        "non-ASCII text must stay as it is (ensure_ascii=False), not become \\u escapes"
    )


def _texts(value) -> list[str]:
    """Every string in a payload: keys and values, inside lists too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_texts(k), *_texts(v))]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []
