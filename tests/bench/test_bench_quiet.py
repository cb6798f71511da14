"""`wait_until_idle` against scripted CPU counters (the oracle: the windows' busy shares)."""

from __future__ import annotations

from nanovllm.bench.quiet import read_cpu_times, wait_until_idle


def scripted(busy_shares: list[float]):
    """A reader of (busy, total) counters whose successive windows have these busy shares."""
    readings = [(0, 0)]
    for share in busy_shares:
        busy, total = readings[-1]
        readings.append((busy + int(share * 1000), total + 1000))
    it = iter(readings)
    return lambda: next(it)


def test_waits_until_a_window_is_idle() -> None:
    slept: list[float] = []
    waited = wait_until_idle(0.1, 0.2, 10.0, scripted([0.9, 0.5, 0.05, 0.9]), slept.append)
    assert slept == [0.2, 0.2, 0.2] and abs(waited - 0.6) < 1e-9


def test_gives_up_after_the_timeout() -> None:
    slept: list[float] = []
    waited = wait_until_idle(0.1, 0.5, 2.0, scripted([0.9] * 10), slept.append)
    assert slept == [0.5] * 4 and waited == 2.0


def test_does_not_wait_without_counters() -> None:
    slept: list[float] = []
    assert wait_until_idle(read=lambda: None, sleep=slept.append) == 0.0 and slept == []


def test_this_machines_counters_grow() -> None:
    first = read_cpu_times()
    if first is None:  # no /proc/stat here
        return
    wait_until_idle(window=0.05, timeout=0.05)
    second = read_cpu_times()
    assert 0 <= first[0] <= second[0] and first[1] < second[1] and first[0] <= first[1]
