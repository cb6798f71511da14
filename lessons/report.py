"""Checking a learner's exercise, and the compact report of the first failure.

`nanovllm lesson N --check` (and every save under `--watch`) runs the lesson's properties
in-process against the learner's file, in order, and stops at the first that fails. The report
is what a learner needs to fix it, and nothing else:

    ✓ test_blocks_needed_is_the_fewest_that_fit
    ✗ test_slot_is_in_the_right_block_at_the_right_offset          (2 of 5)
      A position's slot is in the physical block its block table names, at offset ...
      Input
        seq.block_size  = 4
        seq.seq_len     = 9
        seq.block_table = [7, 2, 9]
        position        = 5
      AssertionError: position 5 is in logical block 1 = physical block 2, but slot 5 is ...
      in your exercise.py, line 21, in slot_for

The one line on what the property means is its docstring; the input comes from
`testing.show_inputs` (named fields of dataclasses and named tuples, one per line) and from the
draws hypothesis notes on the exception (`data.draw(..., label=...)`).

Examples are fresh every check (not the same seed each time), the smallest failing example is
shown (hypothesis shrinks it), and failures are saved in the learner's workspace and tried
first next time (`Workspace.database_dir`): the bug you just saw is the first thing tried after
your fix. Nothing lands in the folder the learner runs it from: hypothesis' own storage (where it
caches Unicode tables) is pointed into the workspace too.
"""

from __future__ import annotations

import dataclasses
import re
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanovllm.lessons.catalog import Lesson

DRAW_NOTE = re.compile(r"^Draw (\d+)(?: \((.*)\))?: (.*?)(?:  # .*)?$")
# hypothesis' note on the failing example of a test it ran: "Failing test case: f(\n    x=1,\n)"
# (older versions: "Falsifying example: ...").
EXAMPLE_NOTE = re.compile(r"^(?:Failing test case|Falsifying example): \w+\($")


@dataclass
class Failure:
    name: str  # the property, e.g. "test_slot_for_..."
    meaning: str  # its docstring, as one line
    inputs: list[tuple[str, str]]  # (field, value) pairs, in order
    message: str  # "AssertionError: ..."
    where: str | None  # "exercise.py, line 21, in slot_for": the last line of yours it ran
    # The calls that led to the failure, as code (a state machine's, `lesson_calls`): shown
    # instead of the inputs.
    calls: list[str] = field(default_factory=list)


@dataclass
class CheckReport:
    lesson: Lesson
    passed_names: list[str] = field(default_factory=list)  # in order, up to the failure
    failure: Failure | None = None
    total: int = 0  # properties in the lesson
    load_error: str | None = None  # the learner's file did not import
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.failure is None and self.load_error is None


@contextmanager
def storage_in(directory: Path) -> Iterator[None]:
    """Point hypothesis' own storage (its Unicode caches) at `directory`, instead of
    `./.hypothesis` in whatever folder the learner runs from, for the duration."""
    from hypothesis import configuration

    directory.mkdir(parents=True, exist_ok=True)
    configuration.set_hypothesis_home_dir(directory)
    try:
        yield
    finally:
        configuration.set_hypothesis_home_dir(None)  # back to hypothesis' own default


def check_exercise(lesson: Lesson, path: Path, database_dir: Path) -> CheckReport:
    """Run `lesson`'s properties against the Python file at `path`; stop at the first failure."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    from nanovllm.lessons import harness

    start = time.perf_counter()
    props = harness.properties(lesson)
    report = CheckReport(lesson, total=len(props))
    try:
        impl = harness.implementation(lesson, path)
    except Exception as exc:  # noqa: BLE001 - a learner's file can fail to import in any way
        report.load_error = _load_error(exc, path)
        report.seconds = time.perf_counter() - start
        return report
    database = DirectoryBasedExampleDatabase(str(database_dir))
    for name, prop in props:
        result = harness.run_property(name, prop, impl, fresh=True, shrink=True, database=database)
        if not result.passed:
            report.failure = describe_failure(name, prop, result.exception, path)
            break
        report.passed_names.append(name)
    report.seconds = time.perf_counter() - start
    return report


def describe_failure(
    name: str, prop: Any, exc: BaseException | None, path: Path | None = None
) -> Failure:
    exc = _innermost(exc) if exc is not None else None
    message = plain_message(exc) if exc is not None else "failed"
    where = last_line_in(exc, path) if exc else None
    calls = list(getattr(exc, "lesson_calls", None) or [])
    if calls:  # the calls say it all: hypothesis' draws would only repeat them, less clearly
        return Failure(name, meaning(prop), [], message, where, calls)
    inputs: list[tuple[str, str]] = []
    for key, value in (getattr(exc, "lesson_inputs", None) or {}).items():
        inputs.extend(named_fields(key, value))
    for label, value in getattr(exc, "lesson_returned", None) or []:
        inputs.append((label, repr(value)))
    notes = getattr(exc, "__notes__", None) or []
    for note in notes:
        match = DRAW_NOTE.match(note.strip())
        if match:
            number, label, value = match.groups()
            inputs.append((label or f"draw {number}", value))
    if not inputs:
        # A property that drives hypothesis itself (lesson 12 runs the learner's properties
        # that way) has only hypothesis' own note on its failing example: show that.
        for note in notes:
            inputs.extend(example_arguments(note))
    return Failure(name, meaning(prop), inputs, message, where)


def example_arguments(note: str) -> list[tuple[str, str]]:
    """The (name, value) arguments of hypothesis' failing-example note, `impl` left out; none
    if `note` is not one. An argument hypothesis wrapped over several lines is joined."""
    lines = note.strip().splitlines()
    if not lines or not EXAMPLE_NOTE.match(lines[0]):
        return []
    arguments: list[tuple[str, str]] = []
    for line in lines[1:]:
        argument = re.match(r"^    (\w+)=(.*)$", line)
        if argument:
            arguments.append((argument.group(1), argument.group(2)))
        elif arguments and line.startswith("    "):  # a wrapped value goes on
            key, value = arguments[-1]
            joint = "" if value.endswith("(") or line.strip()[0] in ")]}" else " "
            arguments[-1] = (key, value + joint + line.strip())
    return [
        (key, value[:-1] if value.endswith(",") else value)
        for key, value in arguments
        if key != "impl"
    ]


def meaning(prop: Any) -> str:
    """A property's docstring, its first paragraph as one line."""
    doc = (getattr(prop, "__doc__", None) or "").strip()
    first = doc.split("\n\n", 1)[0]
    return " ".join(line.strip() for line in first.splitlines())


def named_fields(name: str, value: Any) -> list[tuple[str, str]]:
    """`value` as (field, repr) rows: what its `lesson_rows(name)` gives if it has one, a
    dataclass or named tuple by field, a list of them by index, anything else whole."""
    rows = getattr(value, "lesson_rows", None)
    if callable(rows) and not isinstance(value, type):
        return list(rows(name))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            (f"{name}.{f.name}", repr(getattr(value, f.name))) for f in dataclasses.fields(value)
        ]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        rows = []
        for key, item in zip(value._fields, value):
            rows.extend(named_fields(f"{name}.{key}", item))
        return rows
    if isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
        return [(f"{name}[{i}]", repr(v)) for i, v in enumerate(value)]
    return [(name, repr(value))]


def _innermost(exc: BaseException) -> BaseException:
    # hypothesis may wrap the real error (e.g. in a FlakyFailure group).
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


ALLOCATION = re.compile(r"(?:can't allocate memory|not enough memory).*?(\d+) bytes", re.DOTALL)


def plain_message(exc: BaseException) -> str:
    """ "ExceptionType: message", without the notes (the input is shown on its own). An
    example stopped at its deadline, and an allocation that failed, are said in words."""
    from nanovllm.lessons.harness import ExampleTimeout

    text = str(exc).strip()
    if isinstance(exc, ExampleTimeout):
        return text
    allocation = ALLOCATION.search(text) if isinstance(exc, RuntimeError) else None
    if isinstance(exc, MemoryError) or allocation:
        size = f" ({int(allocation.group(1)) / 2**30:,.1f} GiB at once)" if allocation else ""
        return (
            f"{type(exc).__name__}: your code asked for more memory than this machine has{size}: "
            "is a size computed wrong, or does a list grow without end?"
        )
    # A property's own kind of AssertionError is said as one (its name means nothing to you).
    kind = "AssertionError" if isinstance(exc, AssertionError) else type(exc).__name__
    return f"{kind}: {text}" if text else kind


def last_line_in(exc: BaseException, path: Path | None) -> str | None:
    """The last line of the learner's file that ran before the error, if any did."""
    if path is None:
        return None
    target = Path(path).resolve()
    last = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            if Path(frame.filename).resolve() == target:
                last = frame
        except OSError:
            continue
    if last is None:
        return None
    return f"{target.name}, line {last.lineno}, in {last.name}"


def _load_error(exc: BaseException, path: Path) -> str:
    where = ""
    if isinstance(exc, SyntaxError) and exc.lineno:
        where = f" (line {exc.lineno})"
    else:
        found = last_line_in(exc, path)
        where = f" ({found})" if found else ""
    return f"{plain_message(exc)}{where}"


# --- rendering ----------------------------------------------------------------------------------


def render(console, report: CheckReport, target: Path) -> None:
    """Print `report` compactly (see the module docstring)."""
    from rich.markup import escape

    lesson = report.lesson
    if report.load_error is not None:
        console.print(f"[red]✗ {target.name} does not load:[/] {escape(report.load_error)}")
        return
    for name in report.passed_names:
        console.print(f"[green]✓[/] {name}")
    failure = report.failure
    if failure is None:
        console.print(
            f"[green]All {report.total} properties of lesson {lesson.number} hold[/] "
            f"[dim]({report.seconds:.1f} s)[/]"
        )
        return
    number = len(report.passed_names) + 1
    console.print(f"[red]✗ {failure.name}[/]  [dim]({number} of {report.total})[/]")
    if failure.meaning:
        console.print(f"  [italic]{escape(failure.meaning)}[/]")
    if failure.calls:
        console.print("  Calls")
        for line in failure.calls:
            # Never wrapped: a line of code cut in two would not run as written.
            console.print(f"    {escape(line)}", highlight=False, soft_wrap=True)
    if failure.inputs:
        console.print("  Input")
        width = max(len(key) for key, _ in failure.inputs)
        for key, value in failure.inputs:
            console.print(f"    {escape(key.ljust(width))} = {escape(value)}")
    for i, line in enumerate(failure.message.splitlines()):
        console.print(("  [bold]" if i == 0 else "  ") + escape(line) + ("[/]" if i == 0 else ""))
    if failure.where:
        console.print(f"  [dim]in your {escape(failure.where)}[/]")
