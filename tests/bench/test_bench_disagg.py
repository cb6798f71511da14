"""`nanovllm bench --disagg`: its figures, its server processes, and one tiny real run.

Never asserts a speed. The figures are checked against hand-computed examples (the gaps in a
window, a run's ITL, TTFT and tokens per second, the ratios) and a property (gaps split at any
point add up to the gaps of the whole). The server group is checked with plain processes: each
sees only its cores, and all are gone after the group is left by an exception, one of them
deaf to SIGTERM. One real run of both setups on the embedded model (2 steady streams, 2 burst
prompts of 64 tokens, 4 output tokens each) checks what the consumer reports against an
independent count: it loaded every full prompt block but the one holding the last prompt token
(which is always computed), i.e. (len - 1) // block_size * block_size tokens per request; and
that greedy outputs agree between the setups.
"""

from __future__ import annotations

import math
import os
import sys
import time

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.bench import disagg
from nanovllm.bench.disagg import RunRecord, StreamRecord
from nanovllm.bench.pinned_servers import ServerGroup


def test_gaps_are_those_whose_later_time_is_in_the_window() -> None:
    times = [0.0, 0.010, 0.030, 0.060, 0.100]
    assert disagg.gaps(times, 0.015, 0.080) == pytest.approx([0.020, 0.030])
    assert disagg.gaps(times, 0.030, 0.060) == pytest.approx([0.030])  # (start, end]
    assert disagg.gaps(times, -math.inf, math.inf) == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert disagg.gaps([1.0], 0, 2) == []


@settings(max_examples=examples(50))
@given(
    times=st.lists(st.floats(0, 100, allow_nan=False), max_size=30).map(sorted),
    cut=st.floats(0, 100, allow_nan=False),
)
def test_gaps_split_at_any_point_add_up_to_the_whole(times: list[float], cut: float) -> None:
    whole = disagg.gaps(times, -math.inf, math.inf)
    assert disagg.gaps(times, -math.inf, cut) + disagg.gaps(times, cut, math.inf) == whole
    assert len(whole) == max(len(times) - 1, 0)


def _stream(sent: float, times: list[float], tokens: list[int] | None = None) -> StreamRecord:
    tokens = tokens or [1] * len(times)
    return StreamRecord(sent=sent, chunks=list(zip(times, tokens)))


def test_run_figures_by_hand() -> None:
    # The burst is sent at 1.0; its last token arrives at 1.5: the window is (1.0, 1.5].
    steady = [
        _stream(0.0, [0.8, 0.9, 1.0, 1.3, 1.4, 1.6]),  # gaps in the window: 0.3, 0.1
        _stream(0.0, [0.85, 0.95, 1.05, 1.5], [1, 1, 2, 1]),  # 0.1, 0.45
    ]
    burst = [_stream(1.0, [1.2, 1.5], [1, 3]), _stream(1.0, [1.4])]
    f = disagg.run_figures(RunRecord(steady, burst, burst_start=1.0, external_hits=7))
    assert f["window_s"] == pytest.approx(0.5)
    assert sorted(f["itl_burst"]) == pytest.approx([0.1, 0.1, 0.3, 0.45])
    assert sorted(f["itl_before"]) == pytest.approx([0.1, 0.1, 0.1])  # 0.8-0.9-1.0, 0.85-0.95
    assert sorted(f["ttft"]) == pytest.approx([0.2, 0.4])
    # Tokens arriving in (1.0, 1.5]: steady 1 + 1, 2 + 1; burst 1 + 3, 1. Not 1.6's.
    assert f["tokens"] == 10
    assert f["tok_s"] == pytest.approx(20.0)
    assert f["external_hits"] == 7

    s = disagg.setup_figures([f, {**f, "itl_burst": [1.0], "ttft": [0.6], "tok_s": 40.0}])
    # Pooled: 0.1, 0.1, 0.3, 0.45 and 1.0, sorted; p50 at rank 2 of 0-4 is 0.3; p99 at rank
    # 3.96 is 0.45 + 0.96 x (1.0 - 0.45).
    assert s["itl_p50"] == pytest.approx(0.3)
    assert s["itl_p99"] == pytest.approx(0.45 + 0.96 * 0.55)
    assert s["itl_max"] == pytest.approx(1.0)
    assert s["ttft_p50"] == pytest.approx(0.4)  # of 0.2, 0.4, 0.6
    assert s["tok_s"]["median"] == pytest.approx(30.0)
    assert s["num_gaps"] == 5
    assert s["external_hits"] == 14


def test_ratios_are_disaggregated_over_colocated() -> None:
    def side(scale: float, tok_s: float, window: float) -> dict:
        figures = {k: scale for k in disagg.RATIO_KEYS}
        return {**figures, "tok_s": {"median": tok_s}, "window_s": {"median": window}}

    r = disagg.ratios(side(0.2, 100.0, 2.0), side(0.05, 150.0, 3.0))
    assert all(r[k] == pytest.approx(0.25) for k in disagg.RATIO_KEYS)
    assert r["tok_s"] == pytest.approx(1.5)
    assert r["window_s"] == pytest.approx(1.5)
    zero = disagg.ratios(side(0.0, 0.0, 0.0), side(0.05, 150.0, 3.0))
    assert set(zero.values()) == {None}  # nothing over zero


def test_outputs_agree_on_bursts_and_on_the_steady_prefixes() -> None:
    def run(steady: list[str], burst: list[str]) -> RunRecord:
        record = lambda text: StreamRecord(0.0, text=text)  # noqa: E731
        return RunRecord([record(t) for t in steady], [record(t) for t in burst], 0.0)

    a = run(["abcdef", "xy"], ["one", "two"])
    assert disagg.outputs_agree(a, run(["abc", "xyz"], ["one", "two"]))  # cancelled at others
    assert not disagg.outputs_agree(a, run(["abd", "xy"], ["one", "two"]))
    assert not disagg.outputs_agree(a, run(["abcdef", "xy"], ["one", "tw"]))


PINNED = "import os, sys; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'])"
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); time.sleep(60)"  # fmt: skip


def test_server_group_pins_and_stops_everything_even_on_an_error() -> None:
    processes = []
    with pytest.raises(RuntimeError, match="boom"):
        with ServerGroup(grace_s=0.5) as group:
            pinned = group.launch("pinned", [sys.executable, "-c", PINNED], "", [0])
            deaf = group.launch("deaf", [sys.executable, "-c", DEAF], "", None)
            free = group.launch("free", [sys.executable, "-c", "import time; time.sleep(60)"], "", None)  # fmt: skip
            processes = [s.process for s in (pinned, deaf, free)]
            pinned.process.wait(30)
            deadline = time.monotonic() + 30
            while "ok" not in deaf.log_tail() and time.monotonic() < deadline:
                time.sleep(0.05)  # SIGTERM is ignored from here on
            raise RuntimeError("boom")
    assert all(p.poll() is not None for p in processes)
    assert pinned.log_tail().strip() == "[0] 1"
    assert group.servers == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_tiny_run_loads_the_prompts_over_the_link_and_agrees(monkeypatch) -> None:
    started = []
    launch = ServerGroup.launch

    def recording(self, *args, **kwargs):
        server = launch(self, *args, **kwargs)
        started.append(server.process)
        return server

    monkeypatch.setattr(ServerGroup, "launch", recording)
    prompt_len, block_size, num_burst, num_steady, steady_len = 64, 16, 2, 2, 8
    result = disagg.run(
        num_steady=num_steady,
        steady_prompt_len=steady_len,
        num_burst=num_burst,
        burst_prompt_len=(prompt_len, prompt_len),
        burst_output_len=4,
        warm_tokens=4,
        repeats=1,
        block_size=block_size,
    )
    assert len(started) >= 3 and all(p.poll() is not None for p in started)  # all stopped
    full = lambda n: (n - 1) // block_size * block_size  # noqa: E731
    expected = num_burst * full(prompt_len) + num_steady * full(steady_len)
    assert expected == 96  # 3 of each burst prompt's 4 blocks; no steady prompt fills one
    assert result[disagg.DISAGG]["external_hits"] == expected
    assert result["workload"]["loadable_tokens"] == expected
    assert result[disagg.COLOCATED]["external_hits"] is None
    assert result["outputs_agree"]
    assert result[disagg.DISAGG]["num_gaps"] > 0 and result[disagg.COLOCATED]["num_gaps"] > 0


def test_sigterm_inside_the_run_is_an_exit_and_the_handler_comes_back() -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_:
        with disagg.terminate_as_exit():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this returns
    assert exit_.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
