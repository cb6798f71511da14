"""Running a lesson's properties in-process, against any implementation.

A property is simply called, `prop(impl=...)`, with its hypothesis settings set for the
occasion (starting pytest once per run would cost seconds, and CI judges 14 references, 14
untouched exercises, one stub swap per exercise function and every planted bug: hundreds of
runs). Three occasions:

- CI's verdicts (the default): `derandomize=True`, the same examples every run, so "all planted
  bugs are caught" is a fact about the code, not about luck; no example database (a bug's
  failing example must not leak into the next implementation's run); quiet; no shrinking (only
  *that* a property fails matters).
- soundness (`fresh=True`): new random examples every run, at `scale` times each property's own
  count, so a property that fails correct code on some inputs cannot hide behind a fixed seed.
- the learner's `--check` (`fresh=True, shrink=True, database=...`): new examples, the failures
  saved in the learner's workspace and tried first next time, and the smallest failing example.

Every example has a deadline (`EXAMPLE_DEADLINE_S`; a property that is not a hypothesis one, as
lesson 12's drive hypothesis themselves, has `CALL_DEADLINE_S` for the whole call): past it, the
example is stopped where it is (`deadline`) and the property fails with `ExampleTimeout`, so a
learner's loop that never ends cannot hang a check. Loading a learner's file has one too
(`LOAD_DEADLINE_S`): a loop at its top level is a `TimeoutError` of the file.

`testing.MODE` holds the occasion for the duration, so a property that drives hypothesis itself
(lesson 12) runs the same way.

A planted bug is first tried with a few examples per property (`QUICK_EXAMPLES`), and only put
through the full runs if it survives them: most bugs show at once.

Lesson files are loaded by path (`catalog.load_file`): a folder named `03_...` is not importable.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import Phase, Verbosity, settings
from hypothesis.database import ExampleDatabase

from nanovllm.lessons.catalog import Lesson, all_lessons, lesson_module, load_file
from nanovllm.lessons.testing import MODE, Mutant, RunMode, as_it_was, shown_inputs

EXAMPLE_DEADLINE_S = 30.0  # one example of a property (a first one may compile a kernel)
LOAD_DEADLINE_S = 60.0  # loading a learner's file (its top level runs, imports torch's parts)
CALL_DEADLINE_S = 300.0  # one call of a property that is not a hypothesis one


class ExampleTimeout(BaseException):
    """An example ran past its deadline and was stopped.

    A BaseException, as KeyboardInterrupt is: hypothesis stops the property at once instead of
    shrinking (running again and again) an example that does not end. `lesson_inputs` holds
    the example's inputs, as `testing.show_inputs` attaches them to a failure.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"This example ran past its deadline of {seconds:g} s and was stopped: "
            "does a loop in your code never end?"
        )
        self.seconds = seconds
        self.lesson_inputs: dict[str, Any] = {}


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise `ExampleTimeout` in the code running in the `with` block once it has run for
    `seconds`, and again every second after that (code that catches it and carries on is
    stopped again). Uses SIGALRM, so only in the main thread of a POSIX process; elsewhere the
    block runs without a deadline. A timer set before is set again afterwards, less the time
    spent here."""
    if (
        not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise ExampleTimeout(seconds)

    start = time.monotonic()
    handler = signal.signal(signal.SIGALRM, stop)
    before, interval = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if before > 0:
            left = max(before - (time.monotonic() - start), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, interval)


def timed(test: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """`test` with a deadline of `seconds` per call; a stopped call's inputs go on the error."""

    @functools.wraps(test)
    def timed(*args: Any, **kwargs: Any) -> Any:
        before = {key: as_it_was(value) for key, value in shown_inputs(kwargs).items()}
        try:
            with deadline(seconds):
                return test(*args, **kwargs)
        except ExampleTimeout as exc:
            exc.lesson_inputs = before  # as they were before the example ran
            raise

    return timed


def implementation(lesson: Lesson, choice: str | Path) -> Any:
    """The implementation named by `choice`: "reference" (the engine), "exercise" (the shipped,
    untouched stub) or the path of a Python file (the learner's copy), loaded afresh."""
    if str(choice) in ("reference", "exercise"):
        return lesson_module(lesson, str(choice))
    try:
        with deadline(LOAD_DEADLINE_S):
            return load_file(Path(choice))
    except ExampleTimeout as exc:  # said as an error of the file, where it was stopped
        stopped = TimeoutError(
            f"loading it ran past its deadline of {LOAD_DEADLINE_S:g} s and was stopped: does "
            "a loop at the top level of your file never end?"
        )
        raise stopped.with_traceback(exc.__traceback__) from None


def public_names(lesson: Lesson) -> list[str]:
    """The names an implementation of `lesson` provides: the reference's `__all__`."""
    return list(lesson_module(lesson, "reference").__all__)


def lesson_of(path: Path) -> Lesson:
    """The lesson whose folder holds `path`."""
    folder = path.resolve().parent
    for lesson in all_lessons():
        if lesson.path == folder:
            return lesson
    raise LookupError(f"{path} is not in a lesson folder")


# --- running properties ----------------------------------------------------------------------


@dataclass
class PropertyResult:
    name: str
    passed: bool
    error: str | None  # "ExceptionType: message" of the first failure
    seconds: float
    exception: BaseException | None = None  # the failure itself, for `report`


def properties(lesson: Lesson) -> list[tuple[str, Callable[..., Any]]]:
    """The lesson's properties, in the order they are written."""
    module = lesson_module(lesson, "test_exercise")
    return [
        (name, obj)
        for name, obj in vars(module).items()
        if name.startswith("test_") and callable(obj)
    ]


@contextmanager
def _run_settings(
    prop: Callable[..., Any],
    mode: RunMode,
    scale: float,
    database: ExampleDatabase | None,
    deadline_s: float | None = None,
) -> Iterator[None]:
    """Set a hypothesis property's settings for an in-process run (see the module docstring).

    hypothesis reads a test's settings from this attribute each time it runs, which is also what
    its own `@settings` decorator sets; we swap it for the call and put it back.
    """
    attr = "_hypothesis_internal_use_settings"
    original = getattr(prop, attr, None)
    if original is None:  # a plain function, not a hypothesis property
        with deadline(CALL_DEADLINE_S):
            yield
        return
    examples = max(1, round(original.max_examples * scale))
    if mode.max_examples is not None:
        examples = min(examples, mode.max_examples)
    if mode.shrink:
        # A learner's run: saved failures first (`reuse`), then new examples, then the smallest
        # failing one. Normal verbosity makes hypothesis attach the example's draws as notes.
        phases = [Phase.explicit, Phase.generate, Phase.target, Phase.shrink]
        if database is not None:
            phases.insert(1, Phase.reuse)
        verbosity = Verbosity.normal
    else:
        phases, verbosity = [Phase.explicit, Phase.generate], Verbosity.quiet
    setattr(
        prop,
        attr,
        settings(
            original,
            max_examples=examples,
            derandomize=not mode.fresh,
            database=database if mode.fresh else None,
            verbosity=verbosity,
            phases=phases,
            print_blob=False,
            report_multiple_bugs=False,
        ),
    )
    # hypothesis runs `prop.hypothesis.inner_test` for each example (the attribute is there to
    # be wrapped): each example runs under its deadline.
    inner = prop.hypothesis.inner_test
    prop.hypothesis.inner_test = timed(inner, deadline_s or EXAMPLE_DEADLINE_S)
    try:
        yield
    finally:
        setattr(prop, attr, original)
        prop.hypothesis.inner_test = inner


def run_property(
    name: str,
    prop: Callable[..., Any],
    impl: Any,
    max_examples: int | None = None,
    *,
    fresh: bool = False,
    scale: float = 1.0,
    shrink: bool = False,
    database: ExampleDatabase | None = None,
    deadline_s: float | None = None,
) -> PropertyResult:
    """Run one property against `impl`.

    max_examples: a cap per property. fresh: new random examples (False: derandomized). scale:
    multiplies the property's own example count. shrink: find the smallest failing example.
    database: where failing examples are saved and replayed first (used only when fresh).
    deadline_s: the seconds one example may take (None: `EXAMPLE_DEADLINE_S`, read now).
    """
    start = time.perf_counter()
    mode = RunMode(max_examples=max_examples, fresh=fresh, shrink=shrink, scale=scale)
    token = MODE.set(mode)
    try:
        with _run_settings(prop, mode, scale, database, deadline_s):
            prop(impl=impl)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - any error fails the property (pytest's
        # `Failed` included, which is not an Exception)
        return PropertyResult(name, False, _describe(exc), time.perf_counter() - start, exc)
    finally:
        MODE.reset(token)
    return PropertyResult(name, True, None, time.perf_counter() - start)


def check(
    lesson: Lesson,
    impl: Any,
    *,
    stop_at_first_failure: bool = False,
    max_examples: int | None = None,
    **options: Any,
) -> list[PropertyResult]:
    """Run every property of `lesson` against `impl` (`options`: as for `run_property`)."""
    results = []
    for name, prop in properties(lesson):
        results.append(run_property(name, prop, impl, max_examples, **options))
        if stop_at_first_failure and not results[-1].passed:
            break
    return results


def _describe(exc: BaseException) -> str:
    # hypothesis may wrap the real error (e.g. in a FlakyFailure group): show the innermost.
    # (An exception group has `.exceptions`; `BaseExceptionGroup` itself is Python 3.11+.)
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:
        exc = exc.exceptions[0]
    lines = traceback.format_exception_only(type(exc), exc)
    text = "".join(lines).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --- planted bugs ----------------------------------------------------------------------------


@dataclass
class MutantResult:
    lesson: Lesson
    mutant: Mutant
    caught_by: str | None  # the first property that failed, None if the bug escaped
    error: str | None
    seconds: float

    @property
    def caught(self) -> bool:
        return self.caught_by is not None


QUICK_EXAMPLES = 8  # the first, short pass of `try_mutant`


def mutants(lesson: Lesson) -> list[Mutant]:
    return list(lesson_module(lesson, "mutants").MUTANTS)


def try_mutant(lesson: Lesson, mutant: Mutant, *, fresh: bool = False) -> MutantResult:
    """Run the lesson's properties against one planted bug, stopping at the first that fails.

    Most bugs show within a few examples, so every property first gets a short run; only a bug
    that survives all of them is put through the full runs. fresh: new random examples (as a
    learner's `--check` draws them), not the same ones every run.
    """
    start = time.perf_counter()
    impl = planted(lesson, mutant)
    for budget in (QUICK_EXAMPLES, None):
        results = check(lesson, impl, stop_at_first_failure=True, max_examples=budget, fresh=fresh)
        for result in results:
            if not result.passed:
                return MutantResult(
                    lesson, mutant, result.name, result.error, time.perf_counter() - start
                )
    return MutantResult(lesson, mutant, None, None, time.perf_counter() - start)


def planted(lesson: Lesson, mutant: Mutant) -> Any:
    """The implementation with `mutant`'s bug, marked with what it is (`rebuild` builds the
    same in another process)."""
    impl = mutant.build(lesson_module(lesson, "reference"))
    try:
        impl.__lesson_mutant__ = (lesson.name, mutant.name)
    except AttributeError:  # an object that takes no new attributes: not rebuilt elsewhere
        pass
    return impl


def try_all_mutants(lessons: tuple[Lesson, ...] | None = None) -> list[MutantResult]:
    return [
        try_mutant(lesson, mutant)
        for lesson in (all_lessons() if lessons is None else lessons)
        for mutant in mutants(lesson)
    ]
