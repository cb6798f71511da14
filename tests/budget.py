"""How many hypothesis examples a property runs: its own weight, scaled by the loaded profile.

A test writes `@settings(max_examples=examples(60))`: 60 examples under a budget of 100, which is
hypothesis' default and the `ci` profile's (the full tier). The quick tier's profile has a
smaller budget, so the same property runs proportionally fewer examples there, and a profile
with a larger one (a soak run) runs more. A hard-coded `max_examples=60` would ignore the
profile, which is why no test writes one.
"""

from __future__ import annotations

from hypothesis import settings

# The budget a test's weight is written against (hypothesis' own default `max_examples`).
BASE_BUDGET = 100


def examples(weight: int) -> int:
    """`weight` examples scaled by the loaded profile's `max_examples` (at least 1)."""
    return max(1, round(weight * settings.default.max_examples / BASE_BUDGET))
