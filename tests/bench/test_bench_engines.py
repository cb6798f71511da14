"""The engine plug-in interface: the suite with fake engines, and vLLM's worker with a fake vLLM.

Fake engines return made-up tokens and a made-up wall time, so every figure the suite derives
from them (ratios, agreement, shares of the ceiling) is known exactly; nothing here is timed.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from nanovllm.bench import suite
from nanovllm.bench.engines import ENGINES, Engine, EngineLimits, EngineUnavailable, make_engine
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.roofline import ModelShape
from nanovllm.bench.workload import random_workload, with_poisson_arrivals

CALLS: list[tuple[str, int]] = []  # (engine, requests in the workload) per run, in order


class FakeEngine(Engine):
    """Answers request i with [i, i, ...]; from token `diverge_at` on, with -1 instead."""

    name = "nanovllm"
    wall_s = 2.0
    diverge_at: int | None = None
    fail_on_run: int | None = None  # raise EngineUnavailable on this call of run (1-based)

    def load(self) -> dict:
        self.calls = 0
        return {"num_kv_blocks": 100}

    def run(self, workload, on_tokens=None) -> EngineRun:
        self.calls += 1
        CALLS.append((self.name, workload.num_requests))
        if self.calls == self.fail_on_run:
            raise EngineUnavailable("worker died")
        records = []
        for i, r in enumerate(workload.requests):
            ids = [i if k != self.diverge_at else -1 for k in range(r.max_tokens)]
            records.append(RequestRecord(ids, [0.1 * (k + 1) for k in range(r.max_tokens)]))
        return EngineRun(self.name, self.wall_s, records)


class SlowEngine(FakeEngine):
    name, wall_s, diverge_at = "slow", 4.0, 2


class FlakyEngine(FakeEngine):
    name, fail_on_run = "flaky", 3  # a warm-up and one timed repeat, then the worker dies


class AbsentEngine(FakeEngine):
    name = "absent"

    def load(self) -> dict:
        raise EngineUnavailable("not installed here")


def test_suite_with_fake_engines(monkeypatch) -> None:
    for cls in (FakeEngine, SlowEngine, FlakyEngine, AbsentEngine):
        monkeypatch.setitem(ENGINES, cls.name, cls)
    CALLS.clear()
    cfg = suite.BenchConfig(num_requests=3, output_len=(4, 4), repeats=3, warmup_requests=2)
    main = random_workload(3, (5, 5), (4, 4), vocab_size=50)
    limits = EngineLimits(block_size=16)
    shape = ModelShape(
        hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10
    )
    report: dict = {}
    names = ["nanovllm", "slow", "absent", "flaky"]
    engines = suite.load_engines(names, "unused", limits, shape, report, suite.Progress())
    assert report["absent"] == {"skipped": "not installed here"}
    # The peers are sized by nanovllm's KV cache: 100 blocks of 16 tokens of 64 bytes.
    assert (limits.num_kv_blocks, limits.kv_cache_bytes) == (100, 100 * 16 * 64)

    runs, calibration = suite.measure(engines, main, main, cfg, report, suite.Progress())
    warm = [(name, 2) for name in ("nanovllm", "slow", "flaky")]
    timed = ["nanovllm", "slow", "flaky", "nanovllm", "slow", "flaky", "nanovllm", "slow"]
    assert CALLS == warm + [(name, 3) for name in timed]  # warm-ups, then interleaved repeats
    assert [len(runs[n]) for n in ("nanovllm", "slow", "flaky")] == [3, 3, 1]
    assert report["flaky"]["skipped"] == "worker died" and "flaky" not in engines
    assert calibration == {}

    figures = suite.summarize(runs, greedy=True, ceiling_tok_s=12.0)
    # 12 output tokens: nanovllm in 2 s (6 tok/s), slow in 4 s (3 tok/s).
    assert figures["nanovllm"]["tok_s"]["median"] == 6.0
    assert figures["slow"]["nanovllm_over_this"] == 2.0
    assert figures["slow"]["roofline_share"] == 0.25
    # slow parts ways at token 2 of every 4-token request: 2 of 4 tokens agree.
    assert figures["slow"]["agreement"] == {"tokens_pct": 50.0, "requests_pct": 0.0}
    assert figures["flaky"]["agreement"]["tokens_pct"] == 100.0


def test_paired_ratios_pair_the_repeats() -> None:
    """Repeat i against repeat i: a slow spell of the machine that hits both engines' repeat
    cancels out, which the ratio of the medians cannot see."""

    def run(engine: str, wall_s: float) -> EngineRun:
        return EngineRun(engine, wall_s, [RequestRecord([1] * 10, [wall_s] * 10)])

    runs = {
        "nanovllm": [run("nanovllm", w) for w in (1.0, 0.5, 1.0)],  # 10, 20, 10 tok/s
        "peer": [run("peer", w) for w in (2.0, 1.0, 1.0)],  # 5, 10, 10 tok/s
    }
    figures = suite.summarize(runs, greedy=False, ceiling_tok_s=100.0)["peer"]
    assert figures["nanovllm_over_this"] == 1.0  # medians: 10 / 10
    paired = figures["paired_ratios"]  # 2, 2, 1
    assert (paired["median"], paired["min"], paired["max"]) == (2.0, 1.0, 2.0)


def test_the_reference_engine_must_load(monkeypatch) -> None:
    monkeypatch.setitem(ENGINES, "nanovllm", AbsentEngine)
    with pytest.raises(EngineUnavailable):
        suite.load_engines(["nanovllm"], "unused", EngineLimits(), None, {}, suite.Progress())
    with pytest.raises(ValueError, match="'nope'"):
        make_engine("nope", "unused", EngineLimits())


FAKE_VLLM = '''
import os
__version__ = "fake"

class EngineArgs:
    def __init__(self, **kw):
        self.__dict__.update(kw)

class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)

class _Completion:
    def __init__(self, ids):
        self.token_ids = ids

class _Output:
    def __init__(self, request_id, ids):
        self.request_id, self.outputs = request_id, [_Completion(ids)]

class _Counter:
    def __init__(self, name, value):
        self.name, self.value = name, value

class LLMEngine:
    """One token per request per step: the next is (last * 7 + 1) % 1000."""

    @classmethod
    def from_engine_args(cls, args):
        if os.environ.get("FAKE_VLLM_FAIL"):
            raise RuntimeError("no CPU backend")
        if os.path.isdir("kernels"):  # vLLM's `python -m` subprocesses would import it
            raise RuntimeError("started in a folder whose kernels/ shadows HF's kernels")
        engine = cls()
        engine.live = {}
        engine.preempted = 100  # (a counter kept since start-up, as vLLM's)
        return engine

    def get_metrics(self):
        """vLLM's counter, here one "preemption" per request added."""
        return [_Counter("vllm:num_preemptions", self.preempted), _Counter("other", 7)]

    def reset_prefix_cache(self):
        pass

    def add_request(self, request_id, prompt, params):
        self.live[request_id] = [prompt["prompt_token_ids"][-1], params.max_tokens]
        self.preempted += 1

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        outputs = []
        for request_id, state in list(self.live.items()):
            state[0], state[1] = (state[0] * 7 + 1) % 1000, state[1] - 1
            outputs.append(_Output(request_id, [state[0]]))
            if state[1] == 0:
                del self.live[request_id]
        return outputs
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    (tmp_path / "vllm" / "sampling_params.py").write_text(
        "class RequestOutputKind:\n    DELTA = 1\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return EngineLimits(block_size=16, vllm_python=sys.executable, kv_cache_bytes=2**20)


def test_vllm_plugin_through_its_worker(fake_vllm, tmp_path, monkeypatch) -> None:
    # Run from a folder like this repository's root, whose kernels/ must not reach vLLM.
    (tmp_path / "checkout" / "kernels").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "checkout")
    engine = make_engine("vllm", "some/model", fake_vllm)
    try:
        info = engine.load()
        assert (info["version"], info["block_size"], info["enforce_eager"]) == ("fake", 32, True)
        assert info["reserved_cpus"] == "0"  # (the row's environment reached the worker)
        assert info["omp_wait_policy"] is None  # (not the one `import nanovllm` set here)
        workload = with_poisson_arrivals(random_workload(5, (3, 6), (1, 5), 1000), rate=500.0)
        run = engine.run(workload)
        again = engine.run(workload)
    finally:
        engine.close()
    assert run.engine == "vllm"
    # The counter's growth within each run: one per request, not the count since start-up.
    assert run.extra["num_preemptions"] == again.extra["num_preemptions"] == 5
    for r, rec in zip(workload.requests, run.records):
        expected, last = [], r.prompt_token_ids[-1]
        for _ in range(r.max_tokens):
            last = (last * 7 + 1) % 1000
            expected.append(last)
        assert rec.token_ids == expected and len(rec.token_times) == r.max_tokens
        assert rec.arrival_s == r.arrival_s <= rec.token_times[0]  # served after it arrived


def test_vllm_is_skipped_with_its_reason(fake_vllm, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    engine = make_engine("vllm", "some/model", fake_vllm)
    with pytest.raises(EngineUnavailable, match="no CPU backend"):
        engine.load()
    engine.close()
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    for python, reason in ((None, "no --vllm-python"), (str(tmp_path / "nope"), "does not exist")):
        fake_vllm.vllm_python = python
        with pytest.raises(EngineUnavailable, match=reason):
            make_engine("vllm", "some/model", fake_vllm).load()


def test_the_vllm_rows_run_in_the_configurations_of_vllms_cpu_docs(monkeypatch) -> None:
    """`vllm`: its own binding (auto) with every core computing; `vllm-default`: as installed;
    `--threads N` below the cores binds cores 0..N-1. Each names its configuration."""
    from nanovllm.bench import engine_vllm

    monkeypatch.setattr(engine_vllm.os, "cpu_count", lambda: 4)
    rows = {name: make_engine(name, "unused", EngineLimits()) for name in ENGINES if "vllm" in name}
    assert rows["vllm"].environment() == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert rows["vllm-compiled"].environment() == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert rows["vllm-default"].environment() == {}
    two = make_engine("vllm", "unused", EngineLimits(threads=2)).environment()
    assert two == {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert (
        make_engine("vllm", "unused", EngineLimits(threads=4)).environment()
        == rows["vllm"].environment()
    )
    said = rows["vllm-default"].configuration(2**31)
    assert "VLLM_CPU_OMP_THREADS_BIND=auto" in said and "RESERVED_CPU=default" in said
    assert "KV 2,048 MiB" in said and "enforce_eager" in said
