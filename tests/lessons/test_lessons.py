"""The course's own checks: every lesson is complete, checkable, and checked against the engine.

For each lesson, in-process (starting pytest once per property would cost minutes):

- its properties pass on the engine's code (the lesson's `reference.py`);
- they fail on the untouched exercise, every one of them, so no exercise is solved already;
- every exercise function is needed: the reference with just that one function taken from the
  untouched exercise fails too (no stub is left untested);
- a plain, learner-style solution (`solutions.py`) passes, so the docstrings are enough;
- every planted bug (`mutants.py`) is caught by at least one property.

Then the `nanovllm lesson` command itself: listing, hints, progress, `next`, `--check` through
pytest exactly as a learner runs it, and each lesson's text and demo.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from nanovllm.lessons import harness
from nanovllm.lessons.catalog import all_lessons, get_lesson, lesson_module
from nanovllm.lessons.testing import variant

sys.path.insert(0, str(Path(__file__).parent))  # for `solutions`
from solutions import SOLUTIONS, solve  # noqa: E402

LESSONS = all_lessons()
LESSON_IDS = [lesson.name for lesson in LESSONS]
MUTANTS = [(lesson, m) for lesson in LESSONS for m in harness.mutants(lesson)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: extra threads only contend (badly, on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _triton_for_the_kernel_lesson(request):
    """Lesson 05's kernels need Triton, which ships for Linux x86_64 only."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    lesson = params.get("lesson")
    if lesson is not None and lesson.name == "05_triton_kernel":
        pytest.importorskip("triton")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("NANOVLLM_HOME", str(tmp_path))
    return tmp_path


def _failed(results) -> list[str]:
    return [f"{r.name}: {r.error}" for r in results if not r.passed]


# --- the lessons --------------------------------------------------------------------------------


def test_there_are_twelve_lessons_in_order():
    assert [lesson.number for lesson in LESSONS] == list(range(1, 13))


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_lesson_is_complete(lesson):
    for name in (
        "README.md",
        "demo.py",
        "exercise.py",
        "hints.md",
        "test_exercise.py",
        "reference.py",
        "mutants.py",
    ):
        assert lesson.file(name).is_file(), f"{lesson.name} lacks {name}"
    # Everything in a lesson folder must be shipped as package data (*.md, *.py, *.txt).
    for path in lesson.path.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert path.suffix in (".md", ".py", ".txt"), f"{path} would not be installed"
    text = lesson.readme.read_text()
    assert "**Goal:**" in text, "a lesson states its goal"
    assert lesson.minutes is not None and 10 <= lesson.minutes <= 30
    assert text.rstrip().rsplit("\n## ", 1)[-1].startswith("Exercise"), "it ends with its exercise"
    from nanovllm.lessons.cli import parse_hints

    assert len(parse_hints(lesson.file("hints.md").read_text())) >= 3, "several numbered hints"
    assert callable(lesson_module(lesson, "demo").run)
    assert harness.properties(lesson), "no properties"
    assert harness.mutants(lesson), "no planted bugs"


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_properties_pass_on_the_engine(lesson):
    reference = harness.implementation(lesson, "reference")
    assert not _failed(harness.check(lesson, reference))


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_untouched_exercise_fails_every_property(lesson):
    exercise = harness.implementation(lesson, "exercise")
    names = harness.public_names(lesson)
    assert all(hasattr(exercise, name) for name in names), f"the exercise must define {names}"
    results = harness.check(lesson, exercise, max_examples=harness.QUICK_EXAMPLES)
    passed = [r.name for r in results if r.passed]
    assert not passed, f"these properties pass on the untouched exercise: {passed}"
    assert all("NotImplementedError" in (r.error or "") for r in results)


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_every_exercise_function_is_needed(lesson):
    reference = harness.implementation(lesson, "reference")
    exercise = harness.implementation(lesson, "exercise")
    for name in harness.public_names(lesson):
        impl = variant(reference, **{name: getattr(exercise, name)})
        results = harness.check(
            lesson, impl, stop_at_first_failure=True, max_examples=harness.QUICK_EXAMPLES
        )
        assert _failed(results), f"no property notices that {name} is not implemented"


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_a_learner_style_solution_passes(lesson, tmp_path):
    assert lesson.name in SOLUTIONS, "every exercise has a worked solution in solutions.py"
    solution = harness.implementation(lesson, solve(lesson, tmp_path))
    # A solution need not be explored as deeply as the reference: a few examples each.
    assert not _failed(harness.check(lesson, solution, max_examples=10))


@pytest.mark.parametrize(
    "lesson,mutant", MUTANTS, ids=[f"{lesson.number:02d}-{m.name}" for lesson, m in MUTANTS]
)
def test_planted_bug_is_caught(lesson, mutant):
    result = harness.try_mutant(lesson, mutant)
    assert result.caught, f"{lesson.name}: planted bug {mutant.name!r} escaped every property"


# --- the command ------------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    from nanovllm.cli import main

    return main(["lesson", *argv])


def test_listing_creates_the_workspace(home, capsys):
    assert _cli() == 0
    out = capsys.readouterr().out
    for lesson in LESSONS:
        assert lesson.title[:20] in out
        assert (home / "lessons" / lesson.name / "exercise.py").is_file()
    assert "0/12 passed" in out


def test_the_learners_copy_is_never_overwritten(home, capsys):
    _cli("--path")  # `--path` without a lesson: an error, but the workspace is made
    mine = home / "lessons" / "02_paged_blocks" / "exercise.py"
    mine.write_text("# my work in progress\n")
    (home / "lessons" / "03_free_block_queue" / "exercise.py").unlink()
    assert _cli("2", "--path") == 0
    assert capsys.readouterr().out.strip().endswith(str(mine))
    assert mine.read_text() == "# my work in progress\n"
    assert (home / "lessons" / "03_free_block_queue" / "exercise.py").is_file()


def test_hints_come_one_at_a_time(home, capsys):
    assert _cli("3", "--hint") == 0
    assert "hint 1 of" in capsys.readouterr().out
    assert _cli("3", "--hint") == 0
    assert "hint 2 of" in capsys.readouterr().out
    progress = json.loads((home / "lessons" / "progress.json").read_text())
    assert progress["hints_seen"] == {"03_free_block_queue": 2}


def test_check_runs_pytest_and_records_progress(home, capsys):
    lesson = get_lesson(2)
    assert _cli("2", "--check") == 1, "the untouched exercise must fail"
    assert "Not yet" in capsys.readouterr().out
    solve(lesson, home / "lessons")  # the learner solves it in their copy
    assert _cli("2", "--check") == 0
    out = capsys.readouterr().out
    assert "passed" in out and "nanovllm lesson 3" in out
    progress = json.loads((home / "lessons" / "progress.json").read_text())
    assert list(progress["passed"]) == ["02_paged_blocks"]
    # `next` carries on: lesson 2 was the last one touched and is passed, so lesson 3.
    assert _cli("next", "--path") == 0
    assert "03_free_block_queue" in capsys.readouterr().out
    assert _cli() == 0
    assert "1/12 passed" in capsys.readouterr().out


def test_mutants_report(capsys):
    assert _cli("2", "--mutants") == 0
    out = capsys.readouterr().out
    n = len(harness.mutants(get_lesson(2)))
    assert f"{n}/{n} planted bugs caught" in out


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_lesson_text_and_demo_run(lesson, home, capsys):
    """`nanovllm lesson N`: the text, then the demo, from a fresh workspace."""
    assert _cli(str(lesson.number)) == 0
    out = capsys.readouterr().out
    assert lesson.title[:20] in out
    assert f"Demo: {lesson.title}"[:30] in out
    progress = json.loads((home / "lessons" / "progress.json").read_text())
    assert progress["last"] == lesson.name
