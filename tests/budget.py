"""How many hypothesis examples a property runs: its own weight, scaled by the loaded profile.

A test writes `@settings(max_examples=examples(60))`: 60 examples under a budget of 100, which is
hypothesis' default and the `ci` profile's (the full tier). The quick tier's profile has a
smaller budget, so the same property runs proportionally fewer examples there, and a profile
with a larger one (a soak run) runs more. A hard-coded `max_examples=60` would ignore the
profile, which is why no test writes one.

A state machine's runs also get shorter or longer with the budget (`steps`), but never shorter
than `MIN_STEPS` rules: a run of two or three rules reaches no interesting state. A test that
passes a multiplier instead of a count (the lessons' `harness.check(..., scale=1.5)`) scales it
with `scale`.
"""

from __future__ import annotations

from hypothesis import settings

# The budget a test's weight is written against (hypothesis' own default `max_examples`).
BASE_BUDGET = 100
# The shortest state-machine run `steps` gives (unless the test's own count is shorter).
MIN_STEPS = 10


def _ratio() -> float:
    return settings.default.max_examples / BASE_BUDGET


def examples(weight: int) -> int:
    """`weight` examples scaled by the loaded profile's `max_examples` (at least 1)."""
    return max(1, round(weight * _ratio()))


def steps(weight: int) -> int:
    """A state machine's `stateful_step_count`: `weight` rules per run scaled by the profile,
    at least `MIN_STEPS` (or `weight` itself, when that is smaller)."""
    return max(min(weight, MIN_STEPS), round(weight * _ratio()))


def scale(factor: float) -> float:
    """A multiplier of examples (`factor` times a property's own count) scaled by the profile."""
    return factor * _ratio()
