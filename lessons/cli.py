"""`nanovllm lesson`: list, read, run, check and get hints for the course's lessons.

    nanovllm lesson                 the lessons and your progress
    nanovllm lesson 3               lesson 3: its text, then its live demo
    nanovllm lesson 3 --check       run lesson 3's properties on your exercise; record a pass
    nanovllm lesson 3 --hint        the next hint
    nanovllm lesson 3 --path        where your copy of the exercise is
    nanovllm lesson next            carry on where you stopped (takes the same options)
    nanovllm lesson --mutants       how many of the course's planted bugs its properties catch

Your exercises live in $NANOVLLM_HOME/lessons (default ~/.nanovllm/lessons), copied there on
first use and never overwritten, so your work survives upgrades of the package.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re

from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel
from rich.table import Table

from nanovllm.lessons.catalog import Lesson, all_lessons, get_lesson, lesson_module
from nanovllm.lessons.workspace import Workspace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "lesson", nargs="?", default=None, help="lesson number (or 'next'); omit to list them"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="check your exercise")
    what.add_argument("--hint", action="store_true", help="show the next hint")
    what.add_argument("--path", action="store_true", help="print the path of your exercise")
    what.add_argument("--text", action="store_true", help="only the lesson's text, no demo")
    what.add_argument("--demo", action="store_true", help="only the demo")
    what.add_argument(
        "--mutants",
        action="store_true",
        help="run the properties against every planted bug (of one lesson, or all)",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="IMPL",
        help="with --check: 'reference', 'exercise' (the untouched stub) or a .py file, "
        "instead of your copy (no progress is recorded)",
    )


def run(args: argparse.Namespace) -> int:
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
    if lesson is None:
        if args.lesson == "next":
            console.print("[green]Every lesson is passed. Well done![/]")
            return 0
        if args.check or args.hint or args.path or args.text or args.demo:
            console.print("[red]name a lesson: nanovllm lesson N --check (or 'next')[/]")
            return 2
        _list(console, workspace)
        return 0
    if args.check:
        return _check(console, workspace, lesson, args.against)
    if args.hint:
        return _hint(console, workspace, lesson)
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


def _list(console: Console, workspace: Workspace) -> None:
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


def _show_text(console: Console, workspace: Workspace, lesson: Lesson) -> None:
    console.print(Markdown(lesson.readme.read_text(encoding="utf-8")))
    console.print(
        Panel(
            f"Your exercise: [bold]{workspace.exercise_path(lesson)}[/]\n"
            f"Check it: [bold]nanovllm lesson {lesson.number} --check[/]    "
            f"Stuck? [bold]nanovllm lesson {lesson.number} --hint[/]",
            title=f"Lesson {lesson.number}",
            expand=False,
        )
    )


def _run_demo(console: Console, lesson: Lesson) -> None:
    console.rule(f"[bold]Demo: {lesson.title}")
    _single_thread()
    try:
        demo = lesson_module(lesson, "demo")
    except ModuleNotFoundError as exc:  # e.g. hypothesis, for lesson 12, without the dev extra
        console.print(f"[yellow]This demo needs {exc.name}: pip install 'nanovllm[dev]'[/]")
        return
    demo.run(console)


# --- hints -------------------------------------------------------------------------------------


def parse_hints(text: str) -> list[str]:
    """The numbered hints of a hints.md: each starts with a `## Hint N` heading."""
    parts = re.split(r"^## +Hint +\d+.*$", text, flags=re.MULTILINE)
    return [part.strip() for part in parts[1:] if part.strip()]


def _hint(console: Console, workspace: Workspace, lesson: Lesson) -> int:
    hints = parse_hints(lesson.file("hints.md").read_text(encoding="utf-8"))
    n = min(workspace.next_hint(lesson), len(hints))
    console.print(
        Panel(Markdown(hints[n - 1]), title=f"Lesson {lesson.number}, hint {n} of {len(hints)}")
    )
    if n == len(hints):
        console.print("[dim]That was the last hint.[/]")
    return 0


# --- checking ----------------------------------------------------------------------------------


def _missing_test_tools() -> list[str]:
    return [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]


def _check(console: Console, workspace: Workspace, lesson: Lesson, against: str | None) -> int:
    missing = _missing_test_tools()
    if missing:
        console.print(
            f"[red]Checking needs {' and '.join(missing)}: pip install 'nanovllm[dev]'[/]"
        )
        return 2
    import pytest

    _single_thread()
    target = against or str(workspace.exercise_path(lesson))
    console.print(f"Checking lesson {lesson.number} against [bold]{target}[/]")
    code = pytest.main(
        [
            str(lesson.file("test_exercise.py")),
            "-p",
            "nanovllm.lessons.pytest_plugin",
            f"--lesson-impl={target}",
            # Nothing may be written into the installed package, and no project's pytest
            # configuration (wherever the learner stands) may change the run.
            "-p",
            "no:cacheprovider",
            "-c",
            os.devnull,
            f"--rootdir={lesson.path}",  # names tests "test_exercise.py::..."; nothing is written
            "--import-mode=importlib",
            "-q",
            "--tb=short",
            "--no-header",
        ]
    )
    if code != 0:
        console.print(
            f"[yellow]Not yet.[/] The failing properties above show an example input. "
            f"Stuck? [bold]nanovllm lesson {lesson.number} --hint[/]"
        )
        return 1
    if against is None:
        workspace.mark_passed(lesson)
        console.print(f"[green]Lesson {lesson.number} passed![/]")
        upcoming = workspace.next_lesson()
        if upcoming is not None:
            console.print(f"Next: [bold]nanovllm lesson {upcoming.number}[/] ({upcoming.title})")
    return 0


def _mutants(console: Console, lesson: Lesson | None) -> int:
    missing = _missing_test_tools()
    if missing:
        console.print(f"[red]This needs {' and '.join(missing)}: pip install 'nanovllm[dev]'[/]")
        return 2
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
