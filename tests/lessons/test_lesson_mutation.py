"""Generated mutants (`nanovllm.lessons.mutation`) against each lesson's properties, in CI.

The full run (`nanovllm lesson --mutate`) takes far longer than CI has, so CI runs a fixed sample
of each lesson's generated mutants (the same mutants every run, for the same code) and fails on
one that survives without being listed as equivalent; and every listed one, with two examples per
property, failing on one that is killed (the list says it cannot be, so the list is wrong).
A listed id that is no longer generated (its code changed) fails too.

The fresh-seed sweep (`nanovllm lesson --mutate --fresh K`) shows every mutant that survived any
of its K tries, and fails.

Lesson 12 scores a learner's properties against the generated mutants of the allocator and the
slot mapping: properties that catch every planted bug but not those fail it.
"""

from __future__ import annotations

import pytest

from nanovllm.lessons import harness, mutation
from nanovllm.lessons.catalog import all_lessons, get_lesson, lesson_module
from nanovllm.lessons.testing import variant

# A lesson is measured here once its table is complete: every survivor of the full run killed or
# listed, and its equivalent_mutants.txt written (only comment lines when nothing is listed).
LESSONS = [lesson for lesson in all_lessons() if lesson.file("equivalent_mutants.txt").is_file()]

# Mutants sampled per lesson, and the examples per property a listed one gets (the full run,
# `nanovllm lesson --mutate`, gives them all): the file takes about a minute (measured).
SAMPLE = 4
LISTED = 2


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.name for lesson in LESSONS])
def test_generated_mutants_are_killed_or_listed(lesson):
    if lesson.name == "05_triton_kernel":
        pytest.importorskip("triton")
    pool = {m.id: m for m in mutation.generate(lesson.name)}
    listed = mutation.equivalents(lesson)
    stale = sorted(set(listed) - set(pool))
    assert not stale, f"listed in {lesson.name}/equivalent_mutants.txt but not generated: {stale}"
    survivors = []
    for mutant in mutation.sample(lesson, SAMPLE):
        if mutant.id in listed:
            continue
        verdict = mutation.try_generated(lesson, mutant)
        if verdict.killed_by is None:
            survivors.append(mutant.diff())
    assert not survivors, "generated mutants that no property kills:\n\n" + "\n\n".join(survivors)
    killed = [
        f"{mutant_id} (by {verdict.killed_by}: {verdict.error})"
        for mutant_id in listed
        if (verdict := mutation.try_generated(lesson, pool[mutant_id], quick=LISTED)).killed_by
    ]
    assert not killed, f"listed as equivalent, yet killed: {killed}"


# --- fresh seeds: `nanovllm lesson --mutate --fresh K` ------------------------------------------


@pytest.mark.slow
def test_the_fresh_sweep_shows_each_mutant_that_survived_a_try_and_fails(monkeypatch):
    """The sweep, through its child process: a mutant of lesson 15 listed as equivalent (no
    check can kill it) survives both of 2 fresh tries and is shown, with the count and as
    code; a killed one is not; and the command exits 1."""
    from rich.console import Console

    from nanovllm.lessons import cli

    lesson = get_lesson("15_where_the_kv_lives")
    listed = sorted(mutation.equivalents(lesson))
    assert listed, "the test needs a mutant that survives every try"
    killed = next(m.id for m in mutation.generate(lesson.name) if m.id not in listed)
    row = mutation.fresh_sweep(lesson, 2, only={listed[0], killed})
    assert row.tried == 2
    assert [(m.id, n) for m, n in row.survivors] == [(listed[0], 2)]
    text = mutation.fresh_markdown([row])
    assert f"{listed[0]}: survived 2 of 2 tries" in text
    assert row.survivors[0][0].diff() in text
    assert killed not in text

    def sweep(lesson_, tries, progress=None):
        assert (lesson_, tries) == (lesson, 2)
        return row

    monkeypatch.setattr(mutation, "fresh_sweep", sweep)
    assert cli._mutate(Console(quiet=True), lesson, fresh=2) == 1


# --- lesson 12: scored against the generated pool ------------------------------------------------


def _conservation_and_sizes_only(make_manager, case) -> None:
    """A weak prop_allocator, as a learner might write it: conservation and table sizes only."""
    from nanovllm.lessons.scripts import run_allocator_script
    from nanovllm.lessons.sim import blocks_for

    manager = make_manager(case.num_blocks, case.block_size)
    for snap in run_allocator_script(manager, case.script):
        owned = sum(len(table) for table in snap.tables.values())
        assert manager.num_free_blocks + owned == case.num_blocks
        for rid, table in snap.tables.items():
            assert len(table) == blocks_for(snap.tokens[rid], case.block_size)


def _membership_only(make_manager, case) -> None:
    """A weak prop_allocator: only that no block is owned twice, or both owned and free."""
    from nanovllm.lessons.scripts import run_allocator_script

    manager = make_manager(case.num_blocks, case.block_size)
    for snap in run_allocator_script(manager, case.script):
        owned = [b for table in snap.tables.values() for b in table]
        free = {b.block_id for b in manager.free_block_queue.get_all_free_blocks()}
        assert len(owned) == len(set(owned)) and not free & set(owned)
        assert len(owned) + len(free) == case.num_blocks


@pytest.mark.slow
@pytest.mark.parametrize("weak", [_conservation_and_sizes_only, _membership_only])
def test_lesson_12_fails_properties_that_catch_only_the_planted_bugs(weak):
    """Properties that catch the 7 planted bugs but let generated mutants of the allocator
    through do not pass lesson 12; the failure shows a surviving mutant as code."""
    lesson = get_lesson("12_properties")
    impl = variant(lesson_module(lesson, "reference"), prop_allocator=weak)
    checks = dict(harness.properties(lesson))
    generated = checks.pop("test_catches_every_generated_mutant")
    for name, prop in checks.items():
        result = harness.run_property(name, prop, impl)
        assert result.passed, f"{weak.__name__} fails {name}: {result.error}"
    result = harness.run_property("test_catches_every_generated_mutant", generated, impl)
    assert not result.passed, f"{weak.__name__} passes lesson 12"
    message = str(result.exception)
    assert "pass all your properties" in message
    assert "\n- " in message and "\n+ " in message, message  # the engine's line, the mutant's
