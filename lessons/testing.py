"""What every lesson's `test_exercise.py` and `mutants.py` share.

The contract of a property: a function named `test_*` whose first parameter is `impl`, the
implementation under test (a module, or any object with the lesson's public names), usually
decorated with `@lesson_settings(n)`, hypothesis' `@given(...)` for its other parameters, and
`@show_inputs` (so a failure always shows its input).
Nothing in a property may import the implementation itself; it only reaches it through `impl`.
That is what lets one property judge the learner's code, the engine and a planted bug alike.

`impl` arrives as a pytest fixture under `nanovllm lesson N --check` (see `pytest_plugin`), and as
a keyword argument when `harness` calls the property directly (`prop(impl=...)`), which is how CI
runs hundreds of them in seconds without starting pytest again and again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, settings

# Set by `harness` while it runs properties in-process (CI, `--mutants`): a property that drives
# hypothesis by itself (lesson 12 does) should then skip shrinking and may cap its examples, since
# only pass or fail matters there, not the smallest failing example.
QUICK: ContextVar[int | None] = ContextVar("nanovllm_lessons_quick", default=None)


def quick_mode() -> tuple[bool, int | None]:
    """(running in-process?, the example cap asked for, if any)."""
    cap = QUICK.get()
    return cap is not None, (cap or None)


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


def show_inputs(prop: Callable[..., Any]) -> Callable[..., Any]:
    """Attach a property's inputs (all but `impl`) to any error it raises, as a note.

    hypothesis prints the failing example itself, but under some pytest versions its report shows
    the argument names with blank values; the note makes sure the learner always sees the input
    that broke their code. Goes between `@given` and the function.
    """

    @functools.wraps(prop)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # pytest: show the property's frame, not this one
        try:
            return prop(*args, **kwargs)
        except Exception as exc:
            shown = ", ".join(
                f"{k}={v!r}" for k, v in kwargs.items() if k != "impl" and not _is_data(v)
            )
            if shown and hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(f"Input: {shown}")
            raise

    return wrapper


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
