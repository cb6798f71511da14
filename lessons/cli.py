"""`nanovllm lesson`: list, read, check, watch, run and visualize the course's lessons.

    nanovllm lesson                 the lessons and your progress
    nanovllm lesson 3               lesson 3: its text, then its live demo
    nanovllm lesson 3 --check       check your exercise: the first failing property, or a pass
    nanovllm lesson 3 --watch       check again on every save of your exercise (Ctrl-C stops)
    nanovllm lesson 3 --run         your code checked, then inside the real engine, against the
                                    stock one
    nanovllm lesson 3 --viz         the visualizer, paused where the lesson's idea shows
                                    (with --run: your engine's run)
    nanovllm lesson 3 --hint        the next hint
    nanovllm lesson 3 --reset       your exercise back to its start (yours kept as .bak)
    nanovllm lesson 3 --path        where your copy of the exercise is
    nanovllm lesson next            carry on where you stopped (takes the same options)
    nanovllm lesson --mutants       how many of the course's planted bugs its properties catch
    nanovllm lesson --mutate [N]    how many generated mutants the properties kill (slow: all
                                    sixteen lessons take hours; one lesson, minutes)
    nanovllm lesson --mutate --fresh K [N]
                                    each mutant not listed as equivalent K times, with fresh
                                    random examples: those that survived any try

Your exercises live in $NANOVLLM_HOME/lessons (default ~/.nanovllm/lessons), copied there on
first use and never overwritten, so your work survives upgrades of the package.

Listing, the text and hints load neither torch nor the engine: they answer at once. Checking,
demos and runs load them when they start.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rich.markup import escape

from nanovllm.lessons.catalog import Lesson, all_lessons, get_lesson, lesson_module
from nanovllm.lessons.workspace import Workspace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "lesson", nargs="?", default=None, help="lesson number (or 'next'); omit to list them"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="check your exercise")
    what.add_argument(
        "--watch", action="store_true", help="check your exercise again on every save"
    )
    what.add_argument("--hint", action="store_true", help="show the next hint")
    what.add_argument("--path", action="store_true", help="print the path of your exercise")
    what.add_argument("--text", action="store_true", help="only the lesson's text, no demo")
    what.add_argument("--demo", action="store_true", help="only the demo")
    what.add_argument(
        "--reset",
        action="store_true",
        help="put your exercise back to its start (yours is kept as exercise.py.bak) and "
        "forget the failing examples saved for it",
    )
    what.add_argument(
        "--mutants",
        action="store_true",
        help="run the properties against every planted bug (of one lesson, or all)",
    )
    what.add_argument(
        "--mutate",
        action="store_true",
        help="run the properties against every generated mutant (lessons/mutation.py)",
    )
    parser.add_argument(
        "--fresh",
        type=int,
        default=None,
        metavar="K",
        help="with --mutate: try each mutant not listed as equivalent K times, with fresh random "
        "examples, and show those that survived any try",
    )
    parser.add_argument(
        "--run",
        action="store_true",
        help="check your code, then run the real engine with it; compare with the stock engine",
    )
    # The course's own tests run wrong code in the engine to see that the engine shows it;
    # a learner's --run always checks first.
    parser.add_argument("--unchecked", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--viz",
        action="store_true",
        help="open the visualizer where the lesson's idea shows (with --run: your engine's)",
    )
    parser.add_argument(
        "--screenshot",
        type=Path,
        metavar="OUT",
        help="with --viz: save the paused screen to OUT (.svg, .txt) instead of opening it",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="with --check: hypothesis' complete report through pytest, not the short one",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="IMPL",
        help="with --check or --run: 'reference', 'exercise' (the untouched stub) or a .py "
        "file, instead of your copy (no progress is recorded)",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(highlight=False)
    workspace = Workspace()
    copied = workspace.ensure()
    if copied:
        console.print(
            f"[dim]Copied {len(copied)} exercise(s) to {workspace.root} (yours to edit)[/]"
        )
    try:
        lesson = _pick(args.lesson, workspace)
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    if args.mutants:
        return _mutants(console, lesson)
    if args.fresh is not None and (not args.mutate or args.fresh < 1):
        console.print(
            f"[red]--fresh K goes with --mutate, K 1 or more (got {args.fresh}): "
            "nanovllm lesson --mutate --fresh 5[/]"
        )
        return 2
    if args.mutate:
        return _mutate(console, lesson, args.fresh)
    acts = ("check", "watch", "hint", "path", "text", "demo", "reset")
    if (args.run or args.viz) and any(getattr(args, name) for name in acts):
        console.print("[red]--run and --viz go with a lesson alone: nanovllm lesson N --run[/]")
        return 2
    if lesson is None:
        if args.lesson == "next":
            console.print("[green]Every lesson is passed. Well done![/]")
            return 0
        if any(getattr(args, name) for name in (*acts, "run", "viz")):
            console.print("[red]name a lesson: nanovllm lesson N --check (or 'next')[/]")
            return 2
        _list(console, workspace)
        return 0
    if args.screenshot is not None and not args.viz:
        console.print(
            "[red]--screenshot goes with --viz: nanovllm lesson N --viz --screenshot OUT[/]"
        )
        return 2
    if args.full and not args.check:
        console.print("[red]--full goes with --check: nanovllm lesson N --check --full[/]")
        return 2
    if args.check and args.full:
        return _check_with_pytest(console, workspace, lesson, args.against)
    if args.check:
        return _check(console, workspace, lesson, args.against)
    if args.watch:
        return _watch(console, workspace, lesson)
    if args.run or args.viz:
        return _run_engine(console, workspace, lesson, args)
    if args.hint:
        return _hint(console, workspace, lesson)
    if args.reset:
        return _reset(console, workspace, lesson)
    if args.path:
        print(workspace.exercise_path(lesson))
        return 0
    workspace.mark_opened(lesson)
    if not args.demo:
        _show_text(console, workspace, lesson)
    if not args.text:
        _run_demo(console, lesson)
    return 0


def _pick(key: str | None, workspace: Workspace) -> Lesson | None:
    if key is None:
        return None
    if key == "next":
        return workspace.next_lesson()
    return get_lesson(key)


# --- listing ----------------------------------------------------------------------------------


def _list(console, workspace: Workspace) -> None:
    from rich.table import Table

    progress = workspace.load_progress()
    table = Table(title="nanovllm: the course", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("lesson")
    table.add_column("time", justify="right")
    table.add_column("status")
    for lesson in all_lessons():
        if lesson.name in progress.passed:
            status = "[green]passed[/]"
        elif lesson.name == progress.last:
            status = "[yellow]in progress[/]"
        else:
            status = ""
        minutes = f"{lesson.minutes} min" if lesson.minutes else ""
        table.add_row(str(lesson.number), lesson.title, minutes, status)
    console.print(table)
    done = sum(1 for lesson in all_lessons() if lesson.name in progress.passed)
    console.print(f"{done}/{len(all_lessons())} passed. Your exercises: {workspace.root}")
    upcoming = workspace.next_lesson()
    if upcoming is not None:
        console.print(
            f"Next: [bold]nanovllm lesson {upcoming.number}[/] ({upcoming.title}), "
            "or [bold]nanovllm lesson next[/]"
        )


# --- reading and the demo -----------------------------------------------------------------------


def _show_text(console, workspace: Workspace, lesson: Lesson) -> None:
    from rich.markdown import Markdown
    from rich.panel import Panel

    console.print(Markdown(lesson.readme.read_text(encoding="utf-8")))
    n = lesson.number
    lines = [
        f"Your exercise: [bold]{workspace.exercise_path(lesson)}[/]",
        f"Check it: [bold]nanovllm lesson {n} --check[/] (or [bold]--watch[/]: on every save)"
        f"    Stuck? [bold]nanovllm lesson {n} --hint[/]",
    ]
    if lesson.file("run.py").is_file():
        lines.append(f"Passed? [bold]nanovllm lesson {n} --run[/]: your code in the real engine")
    console.print(Panel("\n".join(lines), title=f"Lesson {n}", expand=False))


def _run_demo(console, lesson: Lesson) -> None:
    console.rule(f"[bold]Demo: {lesson.title}")
    _single_thread()
    try:
        demo = lesson_module(lesson, "demo")
    except ModuleNotFoundError as exc:  # a dependency missing from this installation
        console.print(f"[yellow]This demo {needs([exc.name or 'a module'])}[/]")
        return
    demo.run(console)


# --- hints and reset -----------------------------------------------------------------------------


def parse_hints(text: str) -> list[str]:
    """The numbered hints of a hints.md: each starts with a `## Hint N` heading."""
    parts = re.split(r"^## +Hint +\d+.*$", text, flags=re.MULTILINE)
    return [part.strip() for part in parts[1:] if part.strip()]


SOLUTION_MARK = "(nearly the whole solution)"
"""What a hints.md heading ends with when its hint all but gives the solution away."""


def solution_hints(text: str) -> set[int]:
    """The numbers (from 1) of the hints whose heading carries `SOLUTION_MARK`."""
    headings = re.findall(r"^## +Hint +\d+(.*)$", text, flags=re.MULTILINE)
    return {i for i, rest in enumerate(headings, start=1) if SOLUTION_MARK in rest}


def _hint(console, workspace: Workspace, lesson: Lesson) -> int:
    from rich.markdown import Markdown
    from rich.panel import Panel

    text = lesson.file("hints.md").read_text(encoding="utf-8")
    hints, giveaways = parse_hints(text), solution_hints(text)
    n = min(workspace.next_hint(lesson), len(hints))
    title = f"Lesson {lesson.number}, hint {n} of {len(hints)}"
    if n in giveaways:
        title += ": nearly the whole solution"
    console.print(Panel(Markdown(hints[n - 1]), title=title))
    if n == len(hints):
        console.print("[dim]That was the last hint.[/]")
    elif n + 1 in giveaways:
        last = "the last one, " if n + 1 == len(hints) else ""
        console.print(
            f"[yellow]The next hint ({last}hint {n + 1}) is nearly the whole solution:[/] try "
            "with the hints so far first; `--hint` again shows it."
        )
    return 0


def _reset(console, workspace: Workspace, lesson: Lesson) -> int:
    backup = workspace.reset(lesson)
    console.print(
        f"Lesson {lesson.number}'s exercise is back to its start: {workspace.exercise_path(lesson)}"
    )
    if backup is not None:
        console.print(f"Your previous version is in {backup}")
    console.print("The failing examples saved for it are forgotten.")
    return 0


# --- checking ----------------------------------------------------------------------------------


def needs(names: list[str]) -> str:
    """The hint for missing dependencies: nanovllm lists them all (the checks' pytest and
    hypothesis included), so installing the clone again brings them."""
    return f"needs {' and '.join(names)}, which come with nanovllm: in your clone, run  pip install -e ."


def missing_test_tools() -> list[str]:
    """The checks' tools (pytest, hypothesis) this Python cannot import."""
    import importlib.util

    return [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]


def _needs_test_tools(console) -> bool:
    missing = missing_test_tools()
    if missing:
        console.print(f"[red]This {needs(missing)}[/]")
    return bool(missing)


def _target(workspace: Workspace, lesson: Lesson, against: str | None) -> Path | str:
    if against in ("reference", "exercise"):
        return against
    return Path(against) if against else workspace.exercise_path(lesson)


def _target_file(console, lesson: Lesson, target: Path | str) -> Path | None:
    """The file a check or run reads for `target`; None (said) when there is no such file."""
    path = lesson.file(f"{target}.py") if isinstance(target, str) else target
    if not path.is_file():
        console.print(f"[red]✗ There is no file {escape(str(path))}[/]")
        return None
    return path


def _check(console, workspace: Workspace, lesson: Lesson, against: str | None) -> int:
    if _needs_test_tools(console):
        return 2
    path = _target_file(console, lesson, _target(workspace, lesson, against))
    if path is None:
        return 2
    ok = _check_once(console, workspace, lesson, path, record=against is None)
    return 0 if ok else 1


def _check_once(
    console,
    workspace: Workspace,
    lesson: Lesson,
    path: Path,
    record: bool,
    before_run: bool = False,
) -> bool:
    """One check of the file at `path`, reported compactly; when `record`, records a pass, or
    a failure (the lesson is no longer listed as passed). `before_run`: the check `--run` starts
    with (a failure is said by `--run` itself)."""
    from nanovllm.lessons import report

    _single_thread()
    console.print(f"Checking lesson {lesson.number}: [bold]{escape(str(path))}[/]")
    with report.storage_in(workspace.storage_dir()):
        result = report.check_exercise(lesson, path, workspace.database_dir(lesson))
    report.render(console, result, path)
    if not result.passed:
        if record:
            workspace.forget_pass(lesson)
        if not before_run:
            console.print(
                f"[yellow]Not yet.[/] [dim]Stuck? nanovllm lesson {lesson.number} --hint[/]"
            )
        return False
    if record:
        _record_pass(console, workspace, lesson)
    return True


def _record_pass(console, workspace: Workspace, lesson: Lesson) -> None:
    followers = workspace.mark_passed(lesson)
    console.print(f"[green]Lesson {lesson.number} passed![/]")
    for follower in followers:
        console.print(
            f"Lesson {follower.number}'s exercise now starts from your code: "
            f"{workspace.exercise_path(follower)}"
        )
    if lesson.file("run.py").is_file():
        console.print(f"See it run the real engine: [bold]nanovllm lesson {lesson.number} --run[/]")
    upcoming = workspace.next_lesson()
    if upcoming is not None:
        console.print(f"Next: [bold]nanovllm lesson {upcoming.number}[/] ({upcoming.title})")


def _watch(console, workspace: Workspace, lesson: Lesson) -> int:
    if _needs_test_tools(console):
        return 2
    from nanovllm.lessons.watch import watch

    path = workspace.exercise_path(lesson)

    def check() -> bool:
        if console.is_terminal:
            console.clear()
        passed = _check_once(console, workspace, lesson, path, record=True)
        console.print(f"[dim]Watching {path}: save to check again, Ctrl-C to stop.[/]")
        return passed

    return watch(path, check)


def _check_with_pytest(console, workspace: Workspace, lesson: Lesson, against: str | None) -> int:
    """The check through pytest, with hypothesis' complete report (`--check --full`)."""
    if _needs_test_tools(console):
        return 2
    import os

    import pytest

    from nanovllm.lessons import report

    if _target_file(console, lesson, _target(workspace, lesson, against)) is None:
        return 2
    _single_thread()
    target = str(_target(workspace, lesson, against))
    console.print(f"Checking lesson {lesson.number} against [bold]{target}[/]")
    with report.storage_in(workspace.storage_dir()):
        code = pytest.main(
            [
                str(lesson.file("test_exercise.py")),
                "-p",
                "nanovllm.lessons.pytest_plugin",
                f"--lesson-impl={target}",
                # No project's pytest configuration (wherever the learner stands) may change the
                # run, and pytest's cache is not written (it would go into the installed package).
                "-p",
                "no:cacheprovider",
                "-c",
                os.devnull,
                f"--rootdir={lesson.path}",  # names tests "test_exercise.py::..."
                "--import-mode=importlib",
                "-q",
                "--tb=short",
                "--no-header",
            ]
        )
    if code != 0:
        console.print(f"[yellow]Not yet.[/] Stuck? [bold]nanovllm lesson {lesson.number} --hint[/]")
        return 1
    if against is None:
        _record_pass(console, workspace, lesson)
    return 0


def _mutants(console, lesson: Lesson | None) -> int:
    if _needs_test_tools(console):
        return 2
    from rich.table import Table

    from nanovllm.lessons import harness

    _single_thread()
    lessons = all_lessons() if lesson is None else (lesson,)
    table = Table(title="Planted bugs, and the property that caught each", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("planted bug")
    table.add_column("caught by")
    results = []
    with console.status("running the properties against each planted bug..."):
        for lesson_ in lessons:
            try:
                harness.implementation(lesson_, "reference")
            except ImportError as exc:  # lesson 05 without Triton
                console.print(f"[yellow]Lesson {lesson_.number} skipped: {exc}[/]")
                continue
            for mutant in harness.mutants(lesson_):
                result = harness.try_mutant(lesson_, mutant)
                results.append(result)
                table.add_row(
                    str(lesson_.number),
                    f"[bold]{mutant.name}[/]\n[dim]{mutant.description}[/]",
                    result.caught_by.removeprefix("test_")
                    if result.caught_by
                    else "[red]ESCAPED[/]",
                )
    console.print(table)
    caught = sum(r.caught for r in results)
    colour = "green" if caught == len(results) else "red"
    console.print(f"[{colour}]{caught}/{len(results)} planted bugs caught[/]")
    return 0 if caught == len(results) else 1


def _mutate(console, lesson: Lesson | None, fresh: int | None = None) -> int:
    """The generated mutants' table (`mutation`): each lesson in a niced child process; with
    `fresh`, each mutant not listed as equivalent that many times with fresh examples, and the
    ones that survived any try (`mutation.fresh_sweep`)."""
    if _needs_test_tools(console):
        return 2
    from nanovllm.lessons import harness, mutation

    rows, swept = [], []
    each = "run" if fresh is None else f"tried {fresh} times"
    for lesson_ in all_lessons() if lesson is None else (lesson,):
        try:
            harness.implementation(lesson_, "reference")
        except ImportError as exc:  # lesson 05 without Triton
            console.print(f"[yellow]Lesson {lesson_.number} skipped: {exc}[/]")
            continue
        with console.status(f"lesson {lesson_.number}: generated mutants...") as status:

            def progress(done: int, total: int, status=status, n=lesson_.number) -> None:
                status.update(f"lesson {n}: {done}/{total} generated mutants {each}")

            if fresh is None:
                verdicts = mutation.run_lesson(lesson_, progress=progress)
                rows.append(mutation.figures(lesson_, verdicts))
            else:
                swept.append(mutation.fresh_sweep(lesson_, fresh, progress=progress))
    if fresh is not None:
        print(mutation.fresh_markdown(swept))
        return 0 if all(not row.survivors for row in swept) else 1
    print(mutation.markdown(rows))
    return 0 if all(not row.surviving for row in rows) else 1


# --- your engine, and the visualizer -------------------------------------------------------------


def _run_engine(console, workspace: Workspace, lesson: Lesson, args: argparse.Namespace) -> int:
    """`--run` (your code in the engine, compared), `--viz` (the visualizer at the lesson's
    moment), or both (the visualizer on your engine's run)."""
    from nanovllm.lessons import your_engine
    from nanovllm.lessons.moments import MOMENTS

    if not your_engine.has_run(lesson):
        what = "--run" if args.run else "--viz"
        console.print(
            f"[yellow]Lesson {lesson.number} has no {what}: its exercise is not engine code.[/]"
        )
        return 2
    # Loading the engine (torch, the model's code) takes seconds before anything else shows.
    try:
        with console.status(f"lesson {lesson.number}: loading the engine..."):
            spec = lesson_module(lesson, "run")
    except ImportError as exc:  # lesson 05 without Triton
        console.print(f"[yellow]Lesson {lesson.number}'s --run needs {exc.name or exc}.[/]")
        return 2
    moment = MOMENTS.get(spec.MOMENT) if spec.MOMENT else None
    if args.viz and moment is None:
        console.print(
            f"[yellow]Lesson {lesson.number} has no moment to show in the visualizer: its idea "
            "happens inside a step.[/]"
        )
        return 2
    _single_thread()
    trace = workspace.root / lesson.name / ("your-run.jsonl" if args.run else "stock-run.jsonl")
    if args.run:
        from nanovllm.lessons import harness

        if _needs_test_tools(console):
            return 2
        target = _target(workspace, lesson, args.against)
        path = _target_file(console, lesson, target)
        if path is None:
            return 2
        # Your code is checked first: the engine cannot show every fault (its proposers are
        # certain, so lesson 13's acceptance test never meets a draft distribution), and code
        # that fails its check is never shown as running right.
        checked = args.unchecked or _check_once(
            console, workspace, lesson, path, record=False, before_run=True
        )
        if not checked:
            if args.against is None:  # your own copy fails its check now
                workspace.forget_pass(lesson)
            console.print(
                f"[red]✗ Not run in the engine: your code fails lesson {lesson.number}'s check "
                "(above). Fix that first, then --run again.[/]"
            )
            return 1
        try:
            impl = harness.implementation(lesson, target)
        except Exception as exc:  # noqa: BLE001 - a learner's file can fail to import in any way
            console.print(f"[red]✗ {target} does not load:[/] {escape(str(exc))}")
            return 1
        with console.status("running the stock engine, then yours..."):
            report = your_engine.run_lesson(lesson, impl, record=trace if args.viz else None)
        your_engine.render(console, report)
        if not args.viz:
            return 0 if report.passed else 1
        events = report.events
    else:
        with console.status(
            f"running the engine on lesson {lesson.number}'s workload, to find the moment..."
        ):
            events = your_engine.record_stock(lesson, trace)
    step = moment.find(events)
    if step is None:
        console.print(f"[yellow]This run never reached the moment to show ({moment.words}).[/]")
        return 1
    request = moment.request(events, step)
    on = f" ({request} selected)" if request else ""
    console.print(
        f"The visualizer, paused after step {step}: {moment.words}{on}. Space resumes. "
        "[dim](opening it...)[/]"
    )
    from nanovllm.lessons import viz_adapter

    if args.screenshot is None and not sys.stdout.isatty():
        console.print(
            f"[yellow]The visualizer needs a terminal. Replay it later: nanovllm viz {' '.join(viz_adapter.viz_argv(trace, step, panel=moment.panel, select=request))}[/]"
        )
        return 2
    return viz_adapter.show(trace, step, args.screenshot, moment.panel, request)


def _single_thread() -> None:
    """The properties use tiny tensors: one thread is fastest (more only contend)."""
    import torch

    torch.set_num_threads(1)


def main(argv: list[str] | None = None) -> int:
    """Run as `python -m nanovllm.lessons.cli` (the same as `nanovllm lesson`)."""
    parser = argparse.ArgumentParser(prog="nanovllm lesson", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
