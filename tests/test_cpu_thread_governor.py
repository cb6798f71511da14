"""The CPU runner's thread governor (`backends/cpu_threads.py`): fewer threads while other
processes hold cores, all of them back once the cores are free, and no flapping in between."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.backends import cpu_threads
from nanovllm.backends.cpu_threads import DROP_AT, ThreadGovernor, read_busy_seconds

needs_proc_stat = pytest.mark.skipif(
    read_busy_seconds({0}) is None, reason="the governor reads /proc/stat (Linux)"
)


class FakeMachine:
    """A clock, the CPUs' busy seconds and this process's, advanced by hand."""

    def __init__(self) -> None:
        self.now = self.busy = self.own = self.waited = 0.0
        self.calls: list[int] = []

    def run(self, seconds: float, ours: float, others: float, waiting: float = 0.0) -> None:
        """`seconds` pass with this process on `ours` cores and the others on `others`, while
        this process's threads wait for `waiting` cores' worth of time."""
        self.now += seconds
        self.waited += waiting * seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds

    def governor(self, max_threads: int, num_cpus: int) -> ThreadGovernor:
        g = ThreadGovernor(
            max_threads,
            busy_seconds=lambda: self.busy,
            own_seconds=lambda: self.own,
            waited_seconds=lambda: self.waited,
            clock=lambda: self.now,
            set_threads=self.calls.append,
        )
        g.num_cpus = num_cpus
        return g


def steps(
    g: ThreadGovernor, m: FakeMachine, n: int, ours: float, others: float, waiting: float = 0.0
) -> list[int]:
    """`n` steps of 0.1 s each: the threads the governor gave each one."""
    given = []
    for _ in range(n):
        given.append(g.tick())
        m.run(0.1, ours=min(ours, g.threads), others=others, waiting=waiting)
        g.step_ended()
    return given


def test_a_busy_core_takes_a_thread_away_and_a_free_one_gives_it_back() -> None:
    m = FakeMachine()
    g = m.governor(max_threads=2, num_cpus=2)
    assert steps(g, m, 10, ours=2.0, others=0.05) == [2] * 10  # (quiet: a daemon now and then)
    assert m.calls == []
    # Another process shares the two cores with ours: one thread, from the first look after
    # 0.25 s of steps on.
    assert steps(g, m, 10, ours=1.33, others=0.67)[-1] == 1 and m.calls == [1]
    assert steps(g, m, 10, ours=1.0, others=1.0) == [1] * 10  # (it keeps its core)
    assert m.calls == [1]
    assert steps(g, m, 10, ours=1.0, others=0.0)[-1] == 2 and m.calls == [1, 2]  # (it ended)


def test_what_others_do_while_the_engine_is_idle_is_not_contention() -> None:
    m = FakeMachine()
    g = m.governor(max_threads=2, num_cpus=2)
    m.run(30.0, ours=0.0, others=2.0)  # (model loading, another engine's turn in a bench)
    assert steps(g, m, 10, ours=2.0, others=0.0) == [2] * 10 and m.calls == []
    m.run(1.0, ours=0.0, others=2.0)  # (a pause between requests)
    assert steps(g, m, 10, ours=2.0, others=0.0) == [2] * 10 and m.calls == []


def test_threads_of_this_process_that_wait_take_a_thread_until_a_hold_ends() -> None:
    """A grammar compiling beside the engine: no other process, but our threads wait."""
    m = FakeMachine()
    g = m.governor(max_threads=2, num_cpus=2)
    given = steps(g, m, 10, ours=2.0, others=0.0, waiting=0.6)
    assert given[-1] == 1 and m.calls == [1]
    # It ended: the thread comes back once the hold (1 s) is over, not before.
    assert steps(g, m, 5, ours=1.0, others=0.0) == [1] * 5
    assert steps(g, m, 15, ours=2.0, others=0.0)[-1] == 2 and m.calls == [1, 2]
    # It is back at once: given up again, and held twice as long this time.
    assert steps(g, m, 5, ours=2.0, others=0.0, waiting=0.6)[-1] == 1
    assert g.hold == 2.0
    assert steps(g, m, 15, ours=1.0, others=0.0) == [1] * 15  # (1.5 s: still held)
    assert steps(g, m, 10, ours=1.0, others=0.0)[-1] == 2


def test_between_looks_it_reads_nothing() -> None:
    m = FakeMachine()
    g = m.governor(max_threads=2, num_cpus=2)
    steps(g, m, 1, ours=2.0, others=0.0)  # (the first step starts a window)
    reads = []
    g.busy_seconds = lambda: reads.append(1) or m.busy
    assert steps(g, m, 2, ours=0.0, others=2.0) == [2, 2] and reads == []  # (0.2 s < interval)
    assert steps(g, m, 2, ours=0.0, others=2.0) == [1, 1] and reads == [1]


@settings(max_examples=examples(200))
@given(
    num_cpus=st.integers(1, 64),
    max_threads=st.integers(1, 64),
    threads=st.integers(1, 64),
    others=st.floats(0, 64, allow_nan=False),
)
def test_the_choice_is_in_range_never_oversubscribes_and_does_not_flap(
    num_cpus: int, max_threads: int, threads: int, others: float
) -> None:
    g = ThreadGovernor(max_threads, busy_seconds=lambda: None, set_threads=lambda n: None)
    g.num_cpus, g.threads = num_cpus, min(threads, max_threads)
    chosen = g.choose(others)
    assert 1 <= chosen <= max_threads
    # (at most half a core more threads than the cores the others leave free, or one thread)
    assert chosen == 1 or chosen <= num_cpus - others + DROP_AT
    g.threads = chosen  # (the same load a moment later: the same choice)
    assert g.choose(others) == chosen
    if others == 0:  # (a quiet machine runs every thread it may, up to a thread a core)
        assert chosen == min(max_threads, num_cpus)


@settings(max_examples=examples(100))
@given(threads=st.integers(1, 16), a=st.floats(0, 16, allow_nan=False), b=st.floats(0, 16))
def test_more_load_never_means_more_threads(threads: int, a: float, b: float) -> None:
    g = ThreadGovernor(16, busy_seconds=lambda: None, set_threads=lambda n: None)
    g.num_cpus, g.threads = 16, threads
    assert g.choose(max(a, b)) <= g.choose(min(a, b))


def test_busy_time_counts_the_given_cpus_and_not_niced_processes(tmp_path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  999 999 999 999 999 999 999 999 0 0\n"
        "cpu0 10 1000 20 5000 7 1 2 3 0 0\n"
        "cpu1 100 0 200 5000 0 10 20 30 0 0\n"
        "cpu2 7000 0 0 0 0 0 0 0 0 0\n"
        "intr 12345\n"
    )
    hz = cpu_threads.os.sysconf("SC_CLK_TCK")
    assert read_busy_seconds({0, 1}, str(stat)) == pytest.approx((36 + 360) / hz)
    assert read_busy_seconds({0}, str(tmp_path / "none")) is None


@needs_proc_stat
def test_on_this_machine_another_process_shows_up_and_our_own_work_does_not() -> None:
    """The real /proc/stat: a child that spins counts as others; this process's own work not."""
    m = ThreadGovernor(2, interval=0.0, set_threads=lambda n: None)
    others = []
    for spin_elsewhere in (False, True):
        child = None
        if spin_elsewhere:
            child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.3)  # (its interpreter's start-up)
        m.last = m._sample()
        t0, busy0, own0, _ = m.last
        end = time.monotonic() + 0.6
        if not spin_elsewhere:
            while time.monotonic() < end:  # (our own work, one core)
                pass
        else:
            time.sleep(0.6)
        t1, busy1, own1, _ = m._sample()
        if child is not None:
            child.kill()
            child.wait()
        others.append(((busy1 - busy0) - (own1 - own0)) / (t1 - t0))
    assert others[1] > 0.5, others  # (the spinning child had a core, or most of one)
    assert others[1] > others[0] + 0.4, others


def test_the_governor_is_off_when_asked_or_with_one_thread() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert cpu_threads.thread_governor({"NANOVLLM_CPU_THREAD_GOVERNOR": "0"}) is None
        torch.set_num_threads(1)
        assert cpu_threads.thread_governor({}) is None
    finally:
        torch.set_num_threads(threads)


@needs_proc_stat
def test_the_cpu_runner_asks_the_governor_before_every_step(tiny_llama, monkeypatch) -> None:
    from nanovllm import LLM, SamplingParams

    monkeypatch.delenv("NANOVLLM_CPU_THREAD_GOVERNOR", raising=False)
    threads = torch.get_num_threads()
    try:
        llm = LLM(str(tiny_llama), attention_backend="cpu", num_threads=2)
        runner = llm.llm_engine.runner
        assert isinstance(runner.governor, ThreadGovernor) and runner.governor.max_threads == 2
        ticks = []
        runner.governor.tick = lambda: ticks.append(1) or 2
        params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], params, use_tqdm=False)
        assert len(ticks) == 5  # (one prefill step that samples, then four decode steps)
    finally:
        torch.set_num_threads(threads)
