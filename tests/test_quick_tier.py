"""The quick tier still touches every component once.

The quick tier (README, quick start: `HYPOTHESIS_PROFILE=quick python -m pytest -q -m quick`)
is a deliberate selection, the tests marked `quick`. A rename, a moved test or a lost marker
would drop a component from it without a sound; this names each component's quick test and
checks that a test marked `quick` is there for it. A new lesson or architecture is a new
component: it is found from the catalog and the parity table, not written out here.

The oracle is pytest's own collection: this run's, when the run collected the whole suite under
one of the two tiers' `-m` expressions (the quick tier itself, or the full tier) and left out
nothing (no `--ignore`, `--deselect` or `-k`), else a `--collect-only -m quick` of the suite in
a subprocess.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_parity import MODELS

from nanovllm.lessons.catalog import all_lessons

TESTS = Path(__file__).resolve().parent
# The `-m` expressions of the two tiers (README): under them the run collects every quick test.
TIER_MARKERS = ("quick", "not gpu")

PARITY = "tests/test_parity.py::test_greedy_matches_transformers"
LESSON_REFERENCE = (
    "tests/lessons/test_lessons.py::test_properties_pass_on_the_engine_with_fresh_examples"
)


def components() -> dict[str, str]:
    """Each component, with a regular expression for the node ids of its quick test."""
    wanted = {
        "the code's shape (plain path, imports)": r"tests/test_architecture\.py::",
        "from the repository's root, installed packages win over our folders": r"tests/test_import_names\.py::test_transformers_and_the_engine",
        "the scheduler's state machine": r"tests/test_scheduler\.py::TestScheduler",
        "the KV cache manager's state machine": r"tests/test_kv_cache_manager\.py::TestKVCacheManager",
        "a kernel against its reference": r"tests/kernels/test_kernel_cpu_paged_attention\.py::test_matches_reference",
        "the server, through the openai client": r"tests/serve/test_serve_openai\.py::",
        "the tiers themselves": r"tests/test_quick_tier\.py::",
        "the offline API (LLM.generate)": r"tests/test_api\.py::",
        "bad input rejected, the others running": r"tests/test_robustness\.py::test_bad_request",
        "the sampler's filters against vLLM's": r"tests/test_sampler\.py::",
        "the incremental detokenizer": r"tests/test_detokenizer\.py::",
        "speculative decoding": r"tests/test_spec_decode\.py::",
        "tensor parallelism (two ranks)": r"tests/test_tensor_parallel\.py::",
        "the visualizer's reducer against the engine": r"tests/viz/test_viz_state\.py::",
        "the benchmark": r"tests/bench/test_bench_quick\.py::",
        "the lesson command (--check)": r"tests/lessons/test_lesson_tools\.py::",
        "a planted bug, caught": r"tests/test_planted_bugs\.py::",
        "disaggregated prefill and decode (two engines, the real link)": r"tests/test_kv_p2p\.py::test_the_consumer_receives",
    }
    for arch in sorted({options["arch"] for options in MODELS.values()}):
        wanted[f"greedy parity with transformers, {arch}"] = rf"{re.escape(PARITY)}\[{arch}"
    for lesson in all_lessons():
        wanted[f"lesson {lesson.name}'s properties on its reference"] = (
            rf"{re.escape(LESSON_REFERENCE)}\[{lesson.name}\]"
        )
    return wanted


def quick_node_ids(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """The node ids of the quick tier (relative to the repository, as pytest prints them)."""
    whole = [arg for arg in config.args if Path(arg).resolve() in (TESTS, TESTS.parent)]
    # (a run that leaves part of the suite out, as CI's first run leaves out tests/lessons,
    # did not collect every quick test)
    narrowed = any(
        config.getoption(name) for name in ("ignore", "ignore_glob", "deselect", "keyword")
    )
    if whole and not narrowed and config.getoption("markexpr") in TIER_MARKERS:
        return [item.nodeid for item in items if item.get_closest_marker("quick") is not None]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "quick", "-p", "no:cacheprovider"],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-1000:]
    return [line for line in run.stdout.splitlines() if "::" in line]


def missing_components(quick: list[str]) -> list[str]:
    """The components no node id of `quick` tests."""
    return [
        name
        for name, pattern in components().items()
        if not any(re.match(pattern, node) for node in quick)
    ]


@pytest.mark.quick
def test_the_quick_tier_touches_every_component(request: pytest.FixtureRequest) -> None:
    quick = quick_node_ids(request.config, request.session.items)
    missing = missing_components(quick)
    assert not missing, f"the quick tier (-m quick) has no test of: {missing}"


@pytest.mark.quick
def test_a_component_that_lost_its_quick_test_is_named() -> None:
    """The check can fail: the quick tier without its Qwen2 parity test misses exactly that."""
    everything = [pattern.replace("\\", "") for pattern in components().values()]
    assert missing_components(everything) == []
    without_qwen2 = [node for node in everything if f"{PARITY}[qwen2" not in node]
    assert missing_components(without_qwen2) == ["greedy parity with transformers, qwen2"]


def test_a_run_that_leaves_out_a_folder_collects_the_quick_tier_again(monkeypatch) -> None:
    """CI's first run is the full tier with `--ignore=tests/lessons`: its own items lack the
    lessons' quick tests, so the check collects the quick tier in a subprocess instead."""
    options = {"markexpr": "not gpu", "ignore": ["tests/lessons"]}
    config = SimpleNamespace(args=[str(TESTS)], getoption=options.get)
    collected = subprocess.CompletedProcess([], 0, "tests/lessons/test_x.py::test_quick\n", "")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: collected)
    assert quick_node_ids(config, items=[]) == ["tests/lessons/test_x.py::test_quick"]
    options.pop("ignore")
    assert quick_node_ids(config, items=[]) == []  # (this run's own items: none)
