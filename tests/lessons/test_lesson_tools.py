"""The `nanovllm lesson` command: listing, hints, progress, the short check, `--watch`,
`--reset`, lessons that start from an earlier one, `--run` (the learner's code in the real
engine) and `--viz` (the visualizer at the lesson's moment).

A learner is simulated by `solutions.solve`, which writes a plain, learner-style solution into
the workspace, as the learner would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from budget import examples

from nanovllm.lessons import harness, testing, your_engine
from nanovllm.lessons.catalog import all_lessons, get_lesson, lesson_module

sys.path.insert(0, str(Path(__file__).parent))  # for `solutions`
from solutions import solve  # noqa: E402

LESSONS = all_lessons()


def _cli(*argv: str) -> int:
    from nanovllm.lessons.cli import main

    return main(list(argv))


# --- listing, hints, progress -------------------------------------------------------------------


def test_listing_creates_the_workspace(home, capsys):
    assert _cli() == 0
    out = capsys.readouterr().out
    for lesson in LESSONS:
        assert lesson.title[:20] in out
        assert (home / "lessons" / lesson.name / "exercise.py").is_file()
    assert f"0/{len(LESSONS)} passed" in out


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


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.name for lesson in LESSONS])
def test_lesson_text_and_demo_run(lesson, home, capsys):
    """`nanovllm lesson N`: the text, then the demo, from a fresh workspace."""
    assert _cli(str(lesson.number)) == 0
    out = capsys.readouterr().out
    assert lesson.title[:20] in out
    assert f"Demo: {lesson.title}"[:30] in out
    progress = json.loads((home / "lessons" / "progress.json").read_text())
    assert progress["last"] == lesson.name


def test_reading_loads_no_more_than_the_package_does(tmp_path):
    """Listing, the text and hints import neither torch nor the engine themselves: whatever
    `import nanovllm` costs, `nanovllm lesson` adds no torch to it."""
    code = (
        "import sys, nanovllm\n"
        "before = 'torch' in sys.modules\n"
        "from nanovllm.lessons.cli import main\n"
        "for argv in ([], ['3', '--text'], ['3', '--hint'], ['3', '--path']):\n"
        "    main(argv)\n"
        "print('TORCH', before, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "NANOVLLM_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    _, before, after = out.strip().splitlines()[-1].split()
    assert after == before, "the lessons' reading commands imported torch"


# --- checking ---------------------------------------------------------------------------------


def test_check_reports_the_first_failure_compactly(home, tmp_path, capsys, monkeypatch):
    """The short report: the first failing property, what it means, its input by named field,
    the assertion, where in the learner's file. Nothing is written where the learner stands."""
    cwd = tmp_path / "anywhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    lesson = get_lesson(2)
    mine = solve(lesson, home / "lessons")
    mine.write_text(
        mine.read_text().replace(
            "return block_table[logical] * block_size + offset",
            "return block_table[logical] * block_size + offset + (position > 2)",
        )
    )
    assert _cli("2", "--check") == 1
    out = capsys.readouterr().out
    assert "✓ test_blocks_needed_is_the_fewest_that_fit" in out
    assert "✗ test_slot_is_in_the_right_block_at_the_right_offset" in out
    assert "(2 of 6)" in out
    assert "seq.block_table" in out and "seq.block_size" in out and "position" in out
    assert "AssertionError: position" in out
    assert "Not yet" in out
    assert list(cwd.iterdir()) == [], "the check wrote into the learner's current folder"
    assert any((home / "lessons" / lesson.name / ".hypothesis").rglob("*")), (
        "the failing example is saved in the workspace"
    )


@pytest.mark.quick
def test_check_records_progress_and_next_carries_on(home, capsys):
    assert _cli("2", "--check") == 1, "the untouched exercise must fail"
    assert "NotImplementedError: write blocks_needed" in capsys.readouterr().out
    solve(get_lesson(2), home / "lessons")  # the learner solves it in their copy
    assert _cli("2", "--check") == 0
    out = capsys.readouterr().out
    assert "passed" in out and "nanovllm lesson 3" in out and "--run" in out
    progress = json.loads((home / "lessons" / "progress.json").read_text())
    assert list(progress["passed"]) == ["02_paged_blocks"]
    assert _cli("next", "--path") == 0
    assert "03_free_block_queue" in capsys.readouterr().out
    assert _cli() == 0
    assert f"1/{len(LESSONS)} passed" in capsys.readouterr().out


def test_full_check_runs_pytest_and_writes_nothing_where_it_runs(
    home, tmp_path, capsys, monkeypatch
):
    """`--check --full`: hypothesis' own report through pytest. Lesson 11 draws text, for which
    hypothesis caches Unicode tables: in the workspace, not in the learner's current folder."""
    cwd = tmp_path / "anywhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    solve(get_lesson(11), home / "lessons")
    assert _cli("11", "--check", "--full") == 0
    assert "passed" in capsys.readouterr().out
    assert list(cwd.iterdir()) == []


def test_a_load_error_is_reported_in_one_line(home, capsys):
    _cli("--path")
    (home / "lessons" / "11_serving_benchmarking" / "exercise.py").write_text("def oops(:\n")
    assert _cli("11", "--check") == 1
    assert "does not load: SyntaxError" in capsys.readouterr().out


def test_inputs_are_noted_without_add_note():
    """Python 3.10 has no `add_note`: the note goes into `__notes__` by hand."""

    class Legacy:  # stands in for an exception without add_note
        pass

    legacy = Legacy()
    testing._add_note(legacy, "Input: x=1")
    testing._add_note(legacy, "Input: y=2")
    assert legacy.__notes__ == ["Input: x=1", "Input: y=2"]


def test_watch_checks_again_on_every_save(home, capsys, monkeypatch):
    """`--watch`: a check at once, then one after each save that changes the file."""
    from nanovllm.lessons import watch as watch_module

    lesson = get_lesson(2)
    real_watch = watch_module.watch
    saves = []

    def save_a_solution(_seconds: float) -> None:  # stands in for the pause between polls
        if not saves:
            solve(lesson, home / "lessons")  # the learner saves a solution
        saves.append(1)

    monkeypatch.setattr(
        watch_module,
        "watch",
        lambda path, check: real_watch(path, check, max_checks=2, sleep=save_a_solution),
    )
    assert _cli("2", "--watch") == 0
    out = capsys.readouterr().out
    assert out.index("Not yet") < out.index("Lesson 2 passed")
    assert out.count("Checking lesson 2") == 2
    assert len(saves) == 1, "one save, one more check"


def test_reset_restores_the_exercise_and_forgets_saved_failures(home, capsys):
    lesson = get_lesson(2)
    mine = home / "lessons" / lesson.name / "exercise.py"
    assert _cli("2", "--check") == 1
    database = home / "lessons" / lesson.name / ".hypothesis"
    assert database.is_dir()
    mine.write_text(mine.read_text() + "\n# my attempt\n")
    assert _cli("2", "--reset") == 0
    assert mine.read_text() == lesson.file("exercise.py").read_text()
    assert mine.with_name("exercise.py.bak").read_text().endswith("# my attempt\n")
    assert not database.exists()


def test_lessons_7_and_9_start_from_the_learners_lesson_6(home, capsys):
    _cli("--path")
    lessons = home / "lessons"
    touched = lessons / "09_chunked_prefill" / "exercise.py"
    touched.write_text(touched.read_text() + "\n# started already\n")
    solve(get_lesson(6), lessons)
    assert _cli("6", "--check") == 0
    assert "Lesson 7's exercise now starts from your code" in capsys.readouterr().out
    seven = (lessons / "07_preemption" / "exercise.py").read_text()
    assert "Your schedule_step from lesson 06" in seven
    assert "scheduled[r.id] = r.num_tokens" in seven, "the learner's own lines"
    assert "NotImplementedError" not in seven
    assert touched.read_text().endswith("# started already\n"), "a touched copy is never replaced"
    # The copy is a start, not a solution: it knows nothing of memory yet.
    impl = harness.implementation(get_lesson(7), lessons / "07_preemption" / "exercise.py")
    assert [r for r in harness.check(get_lesson(7), impl, max_examples=examples(5)) if not r.passed]
    (lessons / "07_preemption" / "exercise.py").write_text("# scribbles\n")
    assert _cli("7", "--reset") == 0
    assert (lessons / "07_preemption" / "exercise.py").read_text() == seven


# --- the learner's code in the real engine ------------------------------------------------------


@pytest.mark.parametrize("number", [2, 3, 6, 13])
def test_a_learners_solution_runs_the_real_engine(number, home, capsys):
    """Done when: a learner who solved lessons 2, 3, 6 and 13 sees their own code run the
    embedded model to the same output as the stock engine (and, for 3, 6 and 13, the same
    block, scheduling and verification decisions; for 13, with the acceptance rate)."""
    lesson = get_lesson(number)
    solve(lesson, home / "lessons")
    assert _cli(str(number), "--run") == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    completions = 8 if number == 13 else 64
    assert f"Your engine produced the same {completions} completions as the stock engine" in out
    if number == 6:
        assert "every step's scheduling decisions matched" in out
    if number == 13:
        assert "every verification (its proposals, how many accepted) matched" in out
        assert "tokens proposed in" in out and "accepted (" in out


def test_run_names_a_verification_the_engine_cannot_use(home):
    """Lesson 13: a verification rule that writes into the proposals it is given (the engine
    reads them again) is stopped, by name, before the engine trips over them."""
    lesson = get_lesson(13)
    (broken,) = [m for m in harness.mutants(lesson) if m.name == "greedy-builds-in-the-proposals"]
    impl = broken.build(harness.implementation(lesson, "reference"))
    report = your_engine.run_lesson(lesson, impl)
    assert report.error is not None and "changed the proposals it was given" in report.error


def test_run_names_a_tier_that_gives_a_slot_twice_and_shows_one_that_evicts_wrongly(home):
    """Lesson 15: a host tier that gives a new hash a slot another hash still holds is stopped,
    by name, before the engine copies one block's KV over another's (`plug.CheckedHostTier`);
    one that evicts its most recently used entry runs, and the report names the first step
    where it dropped another block than the stock engine's tier."""
    lesson = get_lesson(15)
    reference = harness.implementation(lesson, "reference")
    built = {m.name: m.build(reference) for m in harness.mutants(lesson)}
    report = your_engine.run_lesson(lesson, built["slot-from-the-count"])
    assert report.error is not None and "evicted nothing: its KV would be overwritten" in (
        report.error
    )
    report = your_engine.run_lesson(lesson, built["evicts-mru"])
    assert report.error is None and not report.passed
    assert "dropped from the tier" in (report.decisions_differ or "")


def test_run_catches_what_the_properties_would(home):
    """A slot mapping that ignores where the step starts writes K/V over earlier tokens'; the
    run's completions show it. (A decode's slot is `slot_for`'s, so it shows in the prefills
    that start after a prefix-cache hit, which the lesson's own workload has.)"""
    lesson = get_lesson(2)
    (broken,) = [m for m in harness.mutants(lesson) if m.name == "slot-mapping-from-zero"]
    impl = broken.build(harness.implementation(lesson, "reference"))
    report = your_engine.run_lesson(lesson, impl)
    assert not report.passed
    assert report.divergences or report.error


def test_run_names_a_decision_the_engine_cannot_carry_out(home):
    """A scheduler that gives a request more tokens than it has left is stopped, by name."""
    lesson = get_lesson(6)

    def greedy(running, waiting, max_num_seqs, token_budget):
        while waiting and len(running) < max_num_seqs:
            running.append(waiting.pop(0))
        return {r.id: r.remaining + 1 for r in running}

    impl = testing.variant(harness.implementation(lesson, "reference"), schedule_step=greedy)
    report = your_engine.run_lesson(lesson, impl, workload="short")
    assert report.error is not None and "has" in report.error and "left to compute" in report.error


def _live_children() -> list:
    """This process's child processes still running (tensor-parallel workers are some)."""
    import multiprocessing

    return multiprocessing.active_children()


def test_lesson_14_runs_your_layers_on_two_ranks(home):
    """A learner's shards and combinations, loaded afresh in both ranks' processes, give the
    stock two-rank engine's completions token for token (8 short requests keep it quick), the
    report names each rank's forward time, and no worker process outlives the run."""
    from rich.console import Console

    lesson = get_lesson(14)
    impl = harness.implementation(lesson, solve(lesson, home / "lessons"))
    report = your_engine.run_lesson(lesson, impl, workload="short")
    assert report.passed, (report.error, report.divergences)
    assert report.num_completions == 8
    assert len(your_engine.rank_forward_means(report.events)) == 2
    console = Console(width=300, record=True)
    your_engine.render(console, report)
    out = console.export_text()
    assert "2 tensor-parallel ranks, forward" in out and "your `reduce_rows`" in out
    assert _live_children() == []


def test_lesson_14_names_the_rank_whose_code_failed(home):
    """Code that fails only in rank 1's process (a worker) stops the engine at start-up with
    that rank named, and leaves no process behind."""
    from nanovllm.distributed import WorkerDiedError
    from nanovllm.engine.parts import EngineParts
    from nanovllm.lessons.demo_support import demo_model_path, make_engine
    from nanovllm.lessons.plug_tensor_parallel import your_model_layers

    lesson = get_lesson(14)
    mine = solve(lesson, home / "lessons")
    mine.write_text(
        mine.read_text() + "\n\n_column_shard = column_shard\n\n\n"
        "def column_shard(weight, rank, world_size):\n"
        "    from nanovllm.distributed import get_tp_rank\n\n"
        "    if get_tp_rank() == 1:  # only in rank 1's own process\n"
        "        raise ValueError('rank 1 cannot cut')\n"
        "    return _column_shard(weight, rank, world_size)\n"
    )
    impl = harness.implementation(lesson, mine)
    layers = your_model_layers(impl, demo_model_path(), 2)
    with pytest.raises(WorkerDiedError) as failure:
        make_engine(tensor_parallel_size=2, parts=EngineParts(model_layers=layers))
    assert failure.value.rank == 1
    said = your_engine.describe_error(failure.value, impl)
    assert said.startswith("tensor-parallel rank 1 failed: ModelLoadError: "), said
    assert said.endswith("model.safetensors': rank 1 cannot cut"), said
    assert _live_children() == []


def test_lesson_14_checks_your_shapes_before_any_process_starts(home):
    """A shard of the wrong shape is named, with the function and the rank, before the engine
    starts a worker; code that is not in a file cannot reach the workers, and says so."""
    from nanovllm.lessons.demo_support import demo_model_path
    from nanovllm.lessons.plug import LessonRunError
    from nanovllm.lessons.plug_tensor_parallel import (
        check_on_the_model,
        your_model_layers,
    )

    lesson = get_lesson(14)
    reference = harness.implementation(lesson, "reference")
    (broken,) = [m for m in harness.mutants(lesson) if m.name == "column-shard-takes-columns"]
    with pytest.raises(LessonRunError, match="column_shard of a .* weight for rank 0"):
        check_on_the_model(broken.build(reference), demo_model_path(), 2)
    check_on_the_model(reference, demo_model_path(), 2)
    with pytest.raises(LessonRunError, match="as a file"):
        your_model_layers(broken.build(reference), demo_model_path(), 2)


def test_the_busiest_step_is_found():
    """Lesson 14's moment: the step that computed the most tokens (the first of equals)."""
    from nanovllm.events import StepSummary
    from nanovllm.lessons.moments import MOMENTS

    def summary(step, prefill, decode):
        return StepSummary(step, {}, prefill, decode, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0)

    events = [summary(1, 40, 0), summary(2, 30, 12), summary(3, 0, 8), summary(4, 42, 0)]
    assert MOMENTS["busiest_step"].find(events) == 2
    assert MOMENTS["busiest_step"].find([]) is None


def test_lessons_without_engine_code_say_so(home, capsys):
    assert _cli("12", "--run") == 2
    assert "no --run" in capsys.readouterr().out


# --- the visualizer -------------------------------------------------------------------------------


def test_viz_opens_paused_at_the_first_preemption(home, tmp_path, capsys):
    """`nanovllm lesson 7 --viz`: the stock engine's run, replayed in the visualizer and paused
    at the step of the first preemption (headless here: a screenshot of that screen)."""
    pytest.importorskip("textual")
    shot = tmp_path / "moment.txt"
    assert _cli("7", "--viz", "--screenshot", str(shot)) == 0
    out = capsys.readouterr().out
    assert "the first preemption" in out
    step = int(out.split("paused after step ")[1].split(":")[0])
    screen = shot.read_text()
    assert f"step {step}" in screen
    assert "preempted" in screen


def test_a_hit_from_the_middle_of_the_free_queue_is_found():
    """The free queue's order, followed from the events: a hit on the head or the tail is not
    from the middle; a hit on a block with freed blocks on both sides is."""
    from nanovllm.events import BlockAllocated, BlockFreed, CacheHit, EngineStarted, StepSummary
    from nanovllm.lessons.moments import MOMENTS

    def summary(step):
        return StepSummary(step, {}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0)

    started = EngineStarted("m", 4, 16, 8, 64, 256, True, True, "torch")
    events = [
        started,
        *(BlockAllocated("a", b, b) for b in range(3)),  # queue: 3
        summary(1),
        *(BlockFreed("a", b, 0, True) for b in (2, 1, 0)),  # queue: 3 2 1 0
        summary(2),
        CacheHit("b", 0, 0, True, 1),  # the tail: not the middle; queue: 3 2 1
        summary(3),
        CacheHit("c", 2, 0, True, 1),  # between 3 and 1: the middle
        summary(4),
    ]
    assert MOMENTS["hit_from_the_middle"].find(events) == 4
    assert MOMENTS["first_hit"].find(events) == 3
    assert MOMENTS["preemption"].find(events) is None


def test_rejected_proposals_giving_a_block_back_is_found():
    """Lesson 13's moment: a block freed in the step its request's proposals were rejected,
    unless the request finished in that step (then it frees every block)."""
    from nanovllm.events import (
        BlockFreed,
        RequestFinished,
        SpecTokensVerified,
        StepSummary,
    )
    from nanovllm.lessons.moments import MOMENTS

    def summary(step):
        return StepSummary(step, {}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0)

    events = [
        SpecTokensVerified(1, "a", (5, 6, 7), 3),  # all accepted
        summary(1),
        SpecTokensVerified(2, "a", (5, 6, 7), 1),  # rejected, but no block given back
        summary(2),
        SpecTokensVerified(3, "b", (5, 6), 0),
        BlockFreed("b", 4, 0, False),
        RequestFinished(3, "b", "length", 3, 9),  # b finished: its frees are not a rollback
        summary(3),
        SpecTokensVerified(4, "a", (5, 6, 7), 2),
        BlockFreed("a", 7, 0, False),
        summary(4),
    ]
    assert MOMENTS["rejected_block_freed"].find(events) == 4
    assert MOMENTS["rejected_block_freed"].find(events[:8]) is None


ENGINE_LESSONS = [lesson for lesson in LESSONS if your_engine.has_run(lesson)]


@pytest.mark.slow
@pytest.mark.parametrize("lesson", ENGINE_LESSONS, ids=[lesson.name for lesson in ENGINE_LESSONS])
def test_every_lessons_learner_solution_runs_the_real_engine(lesson, home):
    impl = harness.implementation(lesson, solve(lesson, home / "lessons"))
    report = your_engine.run_lesson(lesson, impl)
    assert report.passed, (report.error, report.divergences, report.decisions_differ)


# A lesson whose idea happens inside a step (`MOMENT = None`: the KV cache, the kernel, sampling)
# has no moment for the visualizer to find, so it has no test here.
MOMENT_LESSONS = [
    lesson for lesson in ENGINE_LESSONS if lesson_module(lesson, "run").MOMENT is not None
]


@pytest.mark.slow
@pytest.mark.parametrize("lesson", MOMENT_LESSONS, ids=[lesson.name for lesson in MOMENT_LESSONS])
def test_every_lessons_moment_happens_in_its_run(lesson, tmp_path):
    from nanovllm.lessons.moments import MOMENTS

    key = lesson_module(lesson, "run").MOMENT
    events = your_engine.record_stock(lesson, tmp_path / "trace.jsonl")
    assert MOMENTS[key].find(events) is not None


# --- reports that read as code --------------------------------------------------------------


def test_a_failing_sequence_of_calls_is_printed_as_code_that_runs(home):
    """Lesson 15's state machine shows a failure as the calls that led to it, runnable as
    written (`tier = HostBlockTier(1)`, `tier.insert(h0)`, `tier.clear()`), the wrong answer
    marked on its line: no draws by label (`hash = ...`, `pins = ...`), no `@seed(...)`. Run as
    written against the same class, the last line gives what its comment says."""
    import io

    from rich.console import Console

    from nanovllm.lessons import report

    lesson = get_lesson(15)
    path = solve(lesson, home / "lessons")
    path.write_text(
        path.read_text().replace("self.free_slots = list(range(self.num_blocks))", "pass")
    )
    impl = harness.implementation(lesson, path)
    name, prop = harness.properties(lesson)[0]  # the state machine
    result = harness.run_property(name, prop, impl, shrink=True)  # the same examples every run
    assert not result.passed
    failure = report.describe_failure(name, prop, result.exception, path)
    console = Console(file=io.StringIO(), width=60)
    report.render(console, report.CheckReport(lesson, failure=failure, total=1), path)
    out = console.file.getvalue()
    assert "  Calls\n" in out and "    tier = HostBlockTier(" in out and "    tier.clear()" in out
    for stray in ("hash =", "pins =", "@seed", "Input"):
        assert stray not in out, out
    for line in failure.calls:
        assert f"    {line}\n" in out, f"{line!r} is not printed whole: {out}"
    *before, last = failure.calls
    namespace = {"HostBlockTier": impl.HostBlockTier}
    exec("\n".join(before), namespace)
    code, comment = last.split("  # ", 1)
    assert comment.startswith(f"returned {eval(code, namespace)!r}"), last


def test_an_input_changed_in_place_is_shown_as_it_was_before_the_call(home, capsys):
    """A top-k that masks the caller's logits in place (masked_fill_) is shown the logits it
    was given, not its own output, and the logits after the call beside them."""
    lesson = get_lesson(10)
    path = solve(lesson, home / "lessons")
    source = path.read_text()
    masked = 'return logits.masked_fill(logits < kth, float("-inf"))'
    assert source.count(masked) == 1
    path.write_text(source.replace(masked, masked.replace("masked_fill", "masked_fill_")))
    assert _cli("10", "--check") == 1
    out = capsys.readouterr().out
    assert "✗ test_top_k_keeps_the_k_largest_and_their_ties" in out, out
    rows = dict(
        line.strip().split(" = ", 1) for line in out.splitlines() if line.startswith("    ")
    )
    rows = {key.strip(): value for key, value in rows.items()}
    assert "-inf" not in rows["logits"], out
    assert "-inf" in rows["logits after the call"], out
    assert "changed the logits it was given" in out
