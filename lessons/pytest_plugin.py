"""pytest plugin for the lesson properties: the `impl` fixture and the `--lesson-impl` option.

`nanovllm lesson N --check --full` runs

    pytest -p nanovllm.lessons.pytest_plugin --lesson-impl ~/.nanovllm/lessons/NN_x/exercise.py \
        .../nanovllm/lessons/NN_x/test_exercise.py

and each property receives the learner's module as `impl`. `--lesson-impl` (or the environment
variable NANOVLLM_LESSON_IMPL) also takes `reference` (the engine: the default) and `exercise`
(the shipped stub), which is handy when working on a lesson itself.

Every example has the harness's deadline (`harness.EXAMPLE_DEADLINE_S`), as in the short check.

Unless a hypothesis profile is chosen already (HYPOTHESIS_PROFILE), failing examples are saved in
the workspace, in the lesson's folder (the same place the short `--check` keeps them), not in
whatever folder the learner happens to run from, and replayed first on the next check: the bug
you just saw is the first thing tried after your fix.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from nanovllm.lessons import harness

IMPL_ENV = "NANOVLLM_LESSON_IMPL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nanovllm lessons")
    group.addoption(
        "--lesson-impl",
        default=None,
        help="implementation the lesson properties check: 'reference' (default), 'exercise' "
        "(the shipped stub) or the path of a Python file",
    )


def pytest_configure(config: pytest.Config) -> None:
    if "HYPOTHESIS_PROFILE" in os.environ:
        return
    from nanovllm.lessons.workspace import Workspace

    workspace = Workspace()
    lessons = []
    for arg in config.args:
        try:
            lessons.append(harness.lesson_of(Path(arg.split("::")[0])))
        except LookupError:
            pass
    database = workspace.database_dir(lessons[0]) if len(lessons) == 1 else workspace.storage_dir()
    settings.register_profile(
        "nanovllm-lessons",
        database=DirectoryBasedExampleDatabase(str(database)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.load_profile("nanovllm-lessons")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each example of a hypothesis property runs under the harness's deadline (hypothesis
    calls `.hypothesis.inner_test` for each; see `harness.deadline`)."""
    for item in items:
        found = getattr(getattr(item, "obj", None), "hypothesis", None)
        if found is not None:
            found.inner_test = harness.timed(found.inner_test, harness.EXAMPLE_DEADLINE_S)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A property that is not a hypothesis one runs under the deadline of a whole call."""
    if getattr(getattr(item, "obj", None), "hypothesis", None) is not None:
        return (yield)
    with harness.deadline(harness.CALL_DEADLINE_S):
        return (yield)


@pytest.fixture(scope="module")
def impl(request: pytest.FixtureRequest):
    """The implementation under test, for every property in the module."""
    choice = request.config.getoption("--lesson-impl") or os.environ.get(IMPL_ENV) or "reference"
    lesson = harness.lesson_of(Path(request.module.__file__))
    return harness.implementation(lesson, choice)
