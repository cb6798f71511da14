"""Shared test setup: hypothesis profiles, a cache of tiny checkpoints, tiny checkpoints.

CI runs the full tier with `HYPOTHESIS_PROFILE=ci` (set by .ci/run): derandomized, so a run is
reproducible, with no deadline (a 2-core CI machine has noisy timing), and a budget of 100
examples (tests/budget.py scales each property's count by it). The quick tier (README, quick
start) runs `-m quick` with `HYPOTHESIS_PROFILE=quick`: the same, at a tenth of the examples.
Locally the default profile (`dev`) explores with fresh random examples each run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

sys.path.insert(0, str(Path(__file__).parent))  # for `tiny_models`, `budget`
from tiny_models import CACHE_ENV  # noqa: E402

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The quick tier: every component touched once, each property at a tenth of its examples.
settings.register_profile("quick", parent=settings.get_profile("ci"), max_examples=10)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The planted-bug check (test_planted_bugs.py): CI's examples, without shrinking the failure
# (only *that* it fails matters there, and shrinking can take longer than finding).
settings.register_profile(
    "planted",
    parent=settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_sessionstart(session: pytest.Session) -> None:
    global _terminal
    _terminal = session.config.pluginmanager.get_plugin("terminalreporter")


_terminal = None  # pytest's terminal writer (its output is never captured)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under CI, a failure's report is printed the moment it happens, not only in the summary
    at the end: a run stopped from outside (CI's own time limit) still shows why tests failed."""
    if os.environ.get("CI") and report.failed and _terminal is not None:
        sections = "".join(f"\n--- {name} ---\n{text[-3000:]}" for name, text in report.sections)
        _terminal.write_line(
            f"\n=== {report.nodeid} failed ({report.when}) ===\n"
            f"{str(report.longrepr)[-6000:]}{sections}"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run torch single-threaded inside a test, restoring the setting afterwards.

    For tiny shapes: worker threads only add start-up and hand-off cost (on a busy two-core
    machine, 100x the work itself). Tests opt in with `pytest.mark.usefixtures`.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def _tiny_models_made_once_per_run(tmp_path_factory) -> Iterator[None]:
    """tiny_models' cache folder for this run: each checkpoint and transformers reference is
    made once, whichever module asks. A process a test starts inherits it (a planted-bug run's
    pytest, say), so it is the run's, not only this process's."""
    if CACHE_ENV in os.environ:  # a pytest started by a test (or the caller's own folder)
        yield
        return
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("tiny_models_cache"))
    try:
        yield
    finally:
        del os.environ[CACHE_ENV]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer random Llama (GQA 4:2, head_dim 16) saved with transformers."""
    from tiny_models import make_model

    return make_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama")
