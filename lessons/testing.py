"""What every lesson's `test_exercise.py` and `mutants.py` share.

The contract of a property: a function named `test_*` whose first parameter is `impl`, the
implementation under test (a module, or any object with the lesson's public names), usually
decorated with `@lesson_settings(n)`, hypothesis' `@given(...)` for its other parameters, and
`@show_inputs` (so a failure always shows its input).
Nothing in a property may import the implementation itself; it only reaches it through `impl`.
That is what lets one property judge the learner's code, the engine and a planted bug alike.

`impl` arrives as a keyword argument when `harness` calls the property directly
(`prop(impl=...)`): that is how `nanovllm lesson N --check` and CI run them, hundreds in seconds,
without starting pytest again and again. Under pytest (`nanovllm lesson N --check --full`, see
`pytest_plugin`) it arrives as a fixture.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, settings


@dataclass(frozen=True)
class RunMode:
    """How `harness` is running the properties right now, in-process (CI, `--check`, `--mutants`).

    A property that drives hypothesis by itself (lesson 12 does) reads it to run the same way.
    """

    max_examples: int | None = None  # a cap on examples per property (None: its own count)
    fresh: bool = False  # fresh random examples; False: derandomized, the same every run
    shrink: bool = False  # look for the smallest failing example (a learner wants it; CI not)
    scale: float = 1.0  # multiplies each property's own count (before the cap)


# Set by `harness` for the duration of a run; None under plain pytest.
MODE: ContextVar[RunMode | None] = ContextVar("nanovllm_lessons_mode", default=None)


def run_mode() -> RunMode | None:
    """The harness's current `RunMode`, or None when the property runs under pytest."""
    return MODE.get()


def lesson_settings(max_examples: int = 30) -> settings:
    """Settings for a lesson property: few examples (the course must check in seconds), no
    deadline (a first call may compile a kernel or warm a cache), one reported failure at a time,
    and no health check about slow data generation (a CI machine is slow)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        report_multiple_bugs=False,  # one failure per property: fix it, then see the next
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def driven_settings(max_examples: int, *, fresh: bool, shrink: bool, **extra: Any) -> settings:
    """Settings for a property that drives hypothesis by itself (lessons 12 and 15), as the
    harness runs it (`run_mode()`): the same examples every run unless `fresh`, shrinking (and
    reporting) only when `shrink`, no deadline, no example database; `extra` adds settings."""
    return settings(
        max_examples=max_examples,
        derandomize=not fresh,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink)
        if shrink
        else (Phase.explicit, Phase.generate),
        verbosity=Verbosity.normal if shrink else Verbosity.quiet,
        **extra,
    )


# What the implementation returned in the property running now (see `returned`).
_RETURNED: ContextVar[list[tuple[str, Any]] | None] = ContextVar(
    "nanovllm_lessons_returned", default=None
)


def returned(label: str, value: Any) -> Any:
    """Keep `value`, what the implementation returned (`label` says from what, e.g. "schedule_step
    returned"), to be shown under the input if the running `show_inputs` property fails; gives
    `value` back."""
    found = _RETURNED.get()
    if found is not None:
        found.append((label, value))
    return value


def show_inputs(prop: Callable[..., Any]) -> Callable[..., Any]:
    """Attach a property's inputs (all but `impl`) to any error it raises.

    Two ways, for two readers: `exc.lesson_inputs` holds them as a dict (what `report` prints,
    one named field per line), and a note "Input: ..." goes on the exception for pytest's
    report. (`add_note` is Python 3.11+; on 3.10 the note is appended to `__notes__`, the list
    `add_note` keeps, by hand.) What the property kept with `returned` goes on the error as
    `exc.lesson_returned`, (label, value) pairs in order. Goes between `@given` and the
    function.

    The inputs are shown as they were before the property ran: a copy is taken first, since
    code that changes its input in place (a top-k that masks the caller's logits) would
    otherwise be shown its own output as the input it was given.
    """

    @functools.wraps(prop)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # pytest: show the property's frame, not this one
        token = _RETURNED.set([])
        before = {key: as_it_was(value) for key, value in shown_inputs(kwargs).items()}
        try:
            return prop(*args, **kwargs)
        except Exception as exc:
            inputs = before
            try:
                exc.lesson_inputs = inputs  # type: ignore[attr-defined]
                exc.lesson_returned = list(_RETURNED.get() or [])  # type: ignore[attr-defined]
            except AttributeError:  # an exception type that takes no new attributes
                pass
            if inputs:
                _add_note(exc, "Input: " + ", ".join(f"{k}={v!r}" for k, v in inputs.items()))
            for label, value in _RETURNED.get() or []:
                _add_note(exc, f"{label}: {value!r}")
            raise
        finally:
            _RETURNED.reset(token)

    return wrapper


def shown_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A property call's inputs as a failure shows them: all but `impl` and hypothesis' `data`
    object (whose draws hypothesis reports itself)."""
    return {k: v for k, v in kwargs.items() if k != "impl" and not _is_data(v)}


def as_it_was(value: Any) -> Any:
    """A copy of `value` that later changes to `value` leave alone: a tensor's clone, else a deep
    copy (`value` itself when it cannot be copied)."""
    clone = getattr(value, "clone", None)
    if callable(clone) and type(value).__module__.startswith("torch"):
        return clone()
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an object that cannot be copied is shown as it is now
        return value


def add_note(exc: BaseException, note: str) -> None:
    """Add `note` to `exc`'s notes (what pytest prints under the error), on any Python."""
    _add_note(exc, note)


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(note)
        return
    notes = getattr(exc, "__notes__", None)
    try:
        if isinstance(notes, list):
            notes.append(note)
        else:
            exc.__notes__ = [note]  # type: ignore[attr-defined]
    except AttributeError:
        pass


def _is_data(value: Any) -> bool:
    """hypothesis' interactive `data` object: its draws are reported by hypothesis itself."""
    return type(value).__name__ == "DataObject"


@contextmanager
def expect_raises(exc_type: type[BaseException], what: str) -> Iterator[None]:
    """Assert that the block raises `exc_type` (like pytest.raises, with a message that says what
    should have raised, and without needing pytest)."""
    try:
        yield
    except exc_type:
        return
    raise AssertionError(f"{what} should raise {exc_type.__name__}, but did not")


def walk_free_list(head: Any, tail: Any, limit: int) -> list[Any]:
    """The blocks of a free list from `head`'s next to `tail` (both ends excluded), following
    `next_free`: at most `limit` blocks and `limit` + 1 links read, so a broken list cannot
    make the walk go on for ever. AssertionError, naming the block, if the list comes back to
    a block it passed (a cycle), holds more than `limit` blocks, or ends (a `next_free` of None)
    before `tail`."""
    out: list[Any] = []
    seen = {id(head)}
    block = head.next_free
    while block is not tail:
        if block is None:
            last = f"block {out[-1].block_id}" if out else "the head sentinel"
            raise AssertionError(
                f"your free list ends before its tail: {last}'s next_free is None "
                f"(head to there: {_path(out)})"
            )
        if id(block) in seen:
            again = "the head sentinel" if block is head else f"block {block.block_id}"
            raise AssertionError(
                f"your free list has a cycle through {again}: from the head, next_free goes "
                f"{_path(out)} -> {again} again"
            )
        if len(out) == limit:
            raise AssertionError(f"your free list holds more than its {limit} blocks")
        seen.add(id(block))
        out.append(block)
        block = block.next_free
    return out


def _path(blocks: list[Any]) -> str:
    return " -> ".join(f"block {b.block_id}" for b in blocks) or "nothing"


@dataclass(frozen=True)
class Mutant:
    """A planted bug: a variant of the reference that the lesson's properties must reject.

    `build` receives the lesson's reference module and returns an implementation with the same
    public names, one of them broken in the way `description` says.
    """

    name: str
    description: str
    build: Callable[[ModuleType], Any]


def variant(reference: ModuleType, **replacements: Any) -> SimpleNamespace:
    """A copy of `reference`'s public names (its `__all__`) with some of them replaced."""
    names = getattr(reference, "__all__", None)
    if names is None:
        raise AttributeError(f"{reference.__name__} must list its public names in __all__")
    unknown = set(replacements) - set(names)
    if unknown:
        raise KeyError(f"{sorted(unknown)} are not public names of {reference.__name__}")
    impl = SimpleNamespace(**{name: getattr(reference, name) for name in names})
    for name, value in replacements.items():
        setattr(impl, name, value)
    impl.__name__ = f"{reference.__name__} (variant)"
    return impl
