"""The course's own checks: every lesson is complete, checkable, and checked against the engine.

For each lesson, in-process (starting pytest once per property would cost minutes):

- its properties pass on the engine's code (the lesson's `reference.py`), on fresh random
  examples every run: a property must never fail correct code, whatever the seed;
- they fail on the untouched exercise, every one of them, so no exercise is solved already;
- every exercise function is needed: the reference with just that one function taken from the
  untouched exercise fails too (no stub is left untested);
- a plain, learner-style solution (`solutions.py`) passes, so the docstrings are enough;
- every planted bug (`mutants.py`) is caught by at least one property.

The `nanovllm lesson` command itself is tested in `test_lesson_tools.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from budget import examples, scale

from nanovllm.lessons import harness
from nanovllm.lessons.catalog import all_lessons, get_lesson, lesson_module
from nanovllm.lessons.report import meaning
from nanovllm.lessons.testing import variant

sys.path.insert(0, str(Path(__file__).parent))  # for `solutions`
from solutions import SOLUTIONS, solve  # noqa: E402

LESSONS = all_lessons()
LESSON_IDS = [lesson.name for lesson in LESSONS]
MUTANTS = [(lesson, m) for lesson in LESSONS for m in harness.mutants(lesson)]


def _failed(results) -> list[str]:
    return [f"{r.name}: {r.error}" for r in results if not r.passed]


# --- the lessons --------------------------------------------------------------------------------


def test_there_are_eighteen_lessons_in_order():
    assert [lesson.number for lesson in LESSONS] == list(range(1, 19))


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
    sections = text.rstrip().split("\n## ")
    assert sections[-2].startswith("Exercise"), "the exercise comes last but one"
    last = sections[-1]
    assert last.startswith("In vLLM itself"), "it ends by pointing to vLLM itself"
    assert "`vllm/" in last or "`tests/v1/" in last, "naming the file in vLLM"
    assert "**Paper" in last, "and the paper the idea comes from"
    for name, prop in harness.properties(lesson):
        assert meaning(prop), (
            f"{name} has no docstring: --check shows it as what the property means"
        )
    from nanovllm.lessons.cli import parse_hints

    assert len(parse_hints(lesson.file("hints.md").read_text())) >= 3, "several numbered hints"
    assert callable(lesson_module(lesson, "demo").run)
    assert harness.properties(lesson), "no properties"
    assert harness.mutants(lesson), "no planted bugs"


@pytest.mark.quick
@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_properties_pass_on_the_engine_with_fresh_examples(lesson):
    """Soundness: a property must never fail correct code. Derandomized runs always try the
    same examples and can hide a property that fails on some inputs, so here every property
    runs on new random examples, 1.5 times its own count, every time the suite runs."""
    reference = harness.implementation(lesson, "reference")
    assert not _failed(harness.check(lesson, reference, fresh=True, scale=scale(1.5)))


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_properties_pass_on_the_engine_with_many_fresh_examples(lesson):
    reference = harness.implementation(lesson, "reference")
    assert not _failed(harness.check(lesson, reference, fresh=True, scale=scale(25)))


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_untouched_exercise_fails_every_property(lesson):
    exercise = harness.implementation(lesson, "exercise")
    names = harness.public_names(lesson)
    assert all(hasattr(exercise, name) for name in names), f"the exercise must define {names}"
    results = harness.check(lesson, exercise, max_examples=examples(harness.QUICK_EXAMPLES))
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
            lesson, impl, stop_at_first_failure=True, max_examples=examples(harness.QUICK_EXAMPLES)
        )
        assert _failed(results), f"no property notices that {name} is not implemented"


@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_a_learner_style_solution_passes(lesson, tmp_path):
    assert lesson.name in SOLUTIONS, "every exercise has a worked solution in solutions.py"
    solution = harness.implementation(lesson, solve(lesson, tmp_path))
    # A solution need not be explored as deeply as the reference: a few examples each.
    assert not _failed(harness.check(lesson, solution, max_examples=examples(10)))


@pytest.mark.parametrize(
    "lesson,mutant", MUTANTS, ids=[f"{lesson.number:02d}-{m.name}" for lesson, m in MUTANTS]
)
def test_planted_bug_is_caught(lesson, mutant):
    result = harness.try_mutant(lesson, mutant)
    assert result.caught, f"{lesson.name}: planted bug {mutant.name!r} escaped every property"


FRESH_SEEDS = 5


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS, ids=LESSON_IDS)
def test_every_planted_bug_is_caught_on_every_fresh_seed(lesson):
    """A learner's `--check` draws new examples every time: a planted bug caught with the
    derandomized examples but not with others would pass some learner's check. Each bug is put
    through the lesson's properties `FRESH_SEEDS` times, each time with new random examples,
    and must be caught every time."""
    escaped = []
    for mutant in harness.mutants(lesson):
        for attempt in range(FRESH_SEEDS):
            if not harness.try_mutant(lesson, mutant, fresh=True).caught:
                escaped.append(f"{mutant.name} (attempt {attempt + 1} of {FRESH_SEEDS})")
    assert not escaped, f"{lesson.name}: planted bugs that escaped a fresh run: {escaped}"


def test_lesson_01_demo_counts_every_token_pass_once():
    """The demo's total equals its rows: the prompt in one pass, then one token per step, and
    no pass for the last token (nothing ever attends to its K/V)."""
    demo = lesson_module(get_lesson(1), "demo")
    model = demo.ToyModel()
    tokens = demo.generate_with_cache(model, [3, 14, 15, 9], 10)
    assert len(tokens) == 10
    assert model.tokens_processed == 4 + 10 - 1
    model.tokens_processed = 0
    assert demo.generate_without_cache(model, [3, 14, 15, 9], 10) == tokens
