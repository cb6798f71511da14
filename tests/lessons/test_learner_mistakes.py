"""What a learner is told about mistakes of their own (issue #52), and the hints' warning.

The learner mistakes themselves are kept in each lesson's `mutants.py` (their names start with
"learner-"), where `test_lessons.py` puts them through the properties like every planted bug;
here: that the failure a mistake gets names the mistake, not another one.
"""

from __future__ import annotations

import json

import pytest

from nanovllm.lessons import harness
from nanovllm.lessons.catalog import get_lesson, lesson_module
from nanovllm.lessons.strategies import SchedState
from nanovllm.lessons.testing import variant


def _mutant(lesson, name: str):
    (mutant,) = [m for m in harness.mutants(lesson) if m.name == name]
    return harness.planted(lesson, mutant)


def _failure(lesson, prop_name: str, impl) -> str:
    prop = dict(harness.properties(lesson))[prop_name]
    result = harness.run_property(prop_name, prop, impl, max_examples=20)
    assert not result.passed, f"{prop_name} passed {impl}"
    return result.error or ""


def test_lesson_04_oracle_is_taken_before_the_call():
    """A paged_decode that scales the caller's query in place, with the right output, is told
    that it changed the query; not that its output is wrong (the oracle once read the query
    after the call, already scaled)."""
    lesson = get_lesson(4)
    impl = _mutant(lesson, "learner-scales-query-in-place")
    error = _failure(lesson, "test_decode_matches_contiguous_attention", impl)
    assert "changed the caller's query in place" in error, error


def test_lesson_01_large_scores_blame_the_ignored_scale():
    """Attention that ignores `scale` fails the large-score property with finite outputs: the
    failure says the scale was ignored, not that exp() overflowed."""
    lesson = get_lesson(1)
    impl = _mutant(lesson, "learner-ignores-scale")
    prop = dict(harness.properties(lesson))["test_attention_is_stable_with_large_scores"]
    # Seed 42: q . k / sqrt(8) and q . k differ enough to move the softmax (most seeds' scores
    # are so far apart that both softmaxes are one-hot).
    with pytest.raises(AssertionError) as failure:
        prop.hypothesis.inner_test(impl=impl, seed=42)
    error = str(failure.value)
    assert "head_dim ** -0.5, not the scale given" in error, error
    assert "inf/nan" not in error


def test_lesson_09_seat_check_says_what_is_wrong():
    """A scheduler that admits past max_num_seqs is told so in words, not with a bare
    AssertionError."""
    lesson = get_lesson(9)
    schedule = lesson_module(lesson, "mutants")._schedule
    impl = variant(
        lesson_module(lesson, "reference"),
        schedule_step=lambda *args: schedule(*args, bug="ignores-seats"),
    )
    prop = dict(harness.properties(lesson))["test_budget_seats_and_running_first"]
    full = SchedState(
        running=((3, 0, 3),), waiting=((2, 0), (2, 0)), max_num_seqs=1, token_budget=9
    )
    with pytest.raises(AssertionError) as failure:
        prop.hypothesis.inner_test(impl=impl, state=full)
    assert "max_num_seqs is 1" in str(failure.value), repr(failure.value)


def test_a_hint_that_gives_the_solution_away_is_announced(home, capsys):
    """The hint before one marked as nearly the whole solution says so, and the marked one's
    title does too."""
    from nanovllm.lessons.cli import main, parse_hints, solution_hints

    lesson = get_lesson(4)
    text = lesson.file("hints.md").read_text()
    marked = solution_hints(text)
    total = len(parse_hints(text))
    assert marked == {total}, f"lesson 04's last hint is its einsums: marked {marked}"
    for n in range(1, total + 1):
        assert main(["4", "--hint"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        if n == total - 1:
            assert f"The next hint (the last one, hint {total}) is nearly the whole" in out, out
        elif n == total:
            assert f"hint {total} of {total}: nearly the whole solution" in out, out
        else:
            assert "nearly the whole solution" not in out, out
    seen = json.loads((home / "lessons" / "progress.json").read_text())["hints_seen"]
    assert seen == {lesson.name: total}


def test_solution_marks_are_read_from_the_headings():
    from nanovllm.lessons.cli import SOLUTION_MARK, parse_hints, solution_hints

    text = f"## Hint 1\n\na\n\n## Hint 2 {SOLUTION_MARK}\n\nb\n\n## Hint 3\n\nc\n"
    assert parse_hints(text) == ["a", "b", "c"]
    assert solution_hints(text) == {2}


def test_a_false_alarm_report_shows_the_failing_script():
    """Lesson 12 runs the learner's properties with hypothesis itself, so the only record of
    the script a false alarm failed on is hypothesis' note (this one from `nanovllm lesson 12
    --check` on a property that insists on consecutive block ids): the report shows it."""
    from nanovllm.lessons.report import describe_failure

    lesson = get_lesson(12)
    name = "test_your_properties_pass_on_the_engine"
    prop = dict(harness.properties(lesson))[name]
    alarm = AssertionError()
    alarm.__notes__ = [
        "Failing test case: search(\n    args=(AllocatorCase(num_blocks=2, block_size=1, script="
        "(('allocate', 'b', 1), ('allocate', 'a', 1), ('free', 'b'))),),\n)"
    ]
    failure = describe_failure(name, prop, alarm)
    assert failure.inputs == [
        (
            "args",
            "(AllocatorCase(num_blocks=2, block_size=1, script=(('allocate', 'b', 1), "
            "('allocate', 'a', 1), ('free', 'b'))),)",
        )
    ]


def test_a_failing_example_note_becomes_the_input():
    from nanovllm.lessons.report import example_arguments

    note = (
        "Falsifying example: test_x(\n    impl=<module>,\n    seq=Sequence(\n        block_size=1,"
        "\n    ),\n    n=3,\n)"
    )
    assert example_arguments(note) == [("seq", "Sequence(block_size=1,)"), ("n", "3")]
    assert example_arguments("Draw 1: 5") == []
