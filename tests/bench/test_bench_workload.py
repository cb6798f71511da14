"""The workload generator: deterministic, and the same lengths whatever the model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanovllm.bench.workload import (
    FIRST_PROMPT_ID,
    Workload,
    parse_range,
    random_workload,
    shared_prefix_workload,
    with_poisson_arrivals,
)


def test_same_seed_same_workload() -> None:
    a = random_workload(16, (4, 40), (2, 30), vocab_size=500, seed=7)
    assert a == random_workload(16, (4, 40), (2, 30), vocab_size=500, seed=7)
    assert a != random_workload(16, (4, 40), (2, 30), vocab_size=500, seed=8)


@given(
    n=st.integers(1, 20),
    extra=st.integers(0, 20),
    seed=st.integers(0, 2**16),
    vocabs=st.tuples(st.integers(8, 600), st.integers(8, 40000)),
    prompt=st.tuples(st.integers(1, 50), st.integers(0, 50)),
    output=st.tuples(st.integers(1, 50), st.integers(0, 50)),
)
def test_lengths_depend_only_on_seed_and_ranges(n, extra, seed, vocabs, prompt, output) -> None:
    prompt_len, output_len = (prompt[0], sum(prompt)), (output[0], sum(output))
    small = random_workload(n, prompt_len, output_len, vocabs[0], seed)
    large = random_workload(n + extra, prompt_len, output_len, vocabs[1], seed)
    # Another vocabulary, more requests after them: request i's lengths do not move.
    assert large.lengths()[:n] == small.lengths()
    for w, vocab in ((small, vocabs[0]), (large, vocabs[1])):
        for r in w.requests:
            assert prompt_len[0] <= r.num_prompt_tokens <= prompt_len[1]
            assert output_len[0] <= r.max_tokens <= output_len[1]
            assert all(FIRST_PROMPT_ID <= t < vocab for t in r.prompt_token_ids)


def test_greedy_has_no_seeds_sampled_has_seeds() -> None:
    assert all(r.seed is None for r in random_workload(4, (4, 4), (4, 4), 50).requests)
    sampled = random_workload(4, (4, 4), (4, 4), 50, temperature=0.8)
    assert all(isinstance(r.seed, int) for r in sampled.requests) and not sampled.greedy


def test_shared_prefix() -> None:
    w = shared_prefix_workload(6, 20, (2, 5), (3, 3), vocab_size=200, seed=0)
    prefix = w.requests[0].prompt_token_ids[:20]
    assert all(r.prompt_token_ids[:20] == prefix for r in w.requests)
    assert all(22 <= r.num_prompt_tokens <= 25 for r in w.requests)


def test_poisson_arrivals_are_seeded_and_increasing() -> None:
    base = random_workload(10, (4, 4), (4, 4), 50)
    a = with_poisson_arrivals(base, rate=5.0, seed=2)
    assert a == with_poisson_arrivals(base, rate=5.0, seed=2)
    times = [r.arrival_s for r in a.requests]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0
    assert a.lengths() == base.lengths()
    with pytest.raises(ValueError, match="rate"):
        with_poisson_arrivals(base, rate=0)


def test_json_round_trip_and_head() -> None:
    w = with_poisson_arrivals(random_workload(5, (3, 9), (2, 8), 64, temperature=0.5), 3.0)
    assert Workload.from_dict(w.to_dict()) == w
    h = w.head(3, output_scale=0.5)
    assert all(r.arrival_s == 0 for r in h.requests)
    assert [r.max_tokens for r in h.requests] == [
        max(1, round(r.max_tokens * 0.5)) for r in w.requests[:3]
    ]


@pytest.mark.parametrize(("text", "expected"), [("32:256", (32, 256)), ("64", (64, 64))])
def test_parse_range(text: str, expected: tuple[int, int]) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["0:4", "9:3", "a:b", "1:2:3", ""])
def test_parse_range_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="range"):
        parse_range(text)
