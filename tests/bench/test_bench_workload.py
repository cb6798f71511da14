"""The workload generator: deterministic, and the same lengths whatever the model."""

from __future__ import annotations

import pytest

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
    b = random_workload(16, (4, 40), (2, 30), vocab_size=500, seed=7)
    assert a == b
    assert random_workload(16, (4, 40), (2, 30), vocab_size=500, seed=8) != a


def test_lengths_do_not_depend_on_the_vocabulary() -> None:
    small = random_workload(32, (32, 256), (64, 256), vocab_size=512, seed=3)
    large = random_workload(32, (32, 256), (64, 256), vocab_size=32000, seed=3)
    assert small.lengths() == large.lengths()
    assert [r.prompt_token_ids for r in small.requests] != [
        r.prompt_token_ids for r in large.requests
    ]


def test_lengths_in_range_and_ids_avoid_special_tokens() -> None:
    w = random_workload(64, (5, 9), (3, 4), vocab_size=100, seed=0)
    for r in w.requests:
        assert 5 <= r.num_prompt_tokens <= 9 and 3 <= r.max_tokens <= 4
        assert all(FIRST_PROMPT_ID <= t < 100 for t in r.prompt_token_ids)
    assert w.num_output_tokens == sum(o for _, o in w.lengths())


def test_a_smaller_run_is_a_prefix_of_a_larger_one() -> None:
    small = random_workload(8, (4, 40), (2, 30), vocab_size=300, seed=1)
    large = random_workload(20, (4, 40), (2, 30), vocab_size=300, seed=1)
    assert large.lengths()[:8] == small.lengths()


def test_greedy_has_no_seeds_sampled_has_seeds() -> None:
    assert all(r.seed is None for r in random_workload(4, 4, 4, 50).requests)
    sampled = random_workload(4, 4, 4, 50, temperature=0.8)
    assert all(isinstance(r.seed, int) for r in sampled.requests)
    assert not sampled.greedy


def test_shared_prefix() -> None:
    w = shared_prefix_workload(6, 20, (2, 5), (3, 3), vocab_size=200, seed=0)
    prefix = w.requests[0].prompt_token_ids[:20]
    assert all(r.prompt_token_ids[:20] == prefix for r in w.requests)
    assert all(22 <= r.num_prompt_tokens <= 25 for r in w.requests)
    assert w.shared_prefix_len == 20


def test_poisson_arrivals_are_seeded_and_increasing() -> None:
    base = random_workload(10, 4, 4, 50)
    a = with_poisson_arrivals(base, rate=5.0, seed=2)
    assert a == with_poisson_arrivals(base, rate=5.0, seed=2)
    times = [r.arrival_s for r in a.requests]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0
    assert a.lengths() == base.lengths() and a.online and not base.online


def test_json_round_trip_and_head() -> None:
    w = with_poisson_arrivals(random_workload(5, (3, 9), (2, 8), 64, temperature=0.5), 3.0)
    assert Workload.from_dict(w.to_dict()) == w
    h = w.head(3, output_scale=0.5)
    assert h.num_requests == 3 and not h.online
    assert [r.max_tokens for r in h.requests] == [
        max(1, round(r.max_tokens * 0.5)) for r in w.requests[:3]
    ]


@pytest.mark.parametrize(
    ("text", "expected"), [("32:256", (32, 256)), ("64", (64, 64)), ("1:1", (1, 1))]
)
def test_parse_range(text: str, expected: tuple[int, int]) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["0:4", "9:3", "a:b", "1:2:3", ""])
def test_parse_range_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="range"):
        parse_range(text)
