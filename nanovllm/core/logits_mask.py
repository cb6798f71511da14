"""The step's logits mask: tokens some rows may not take, applied at one place before sampling.

Structured outputs constrain a request to a grammar: each step, the tokens its grammar does not
allow get -inf in its logits rows (`structured_output/bitmask.py`'s `GrammarBitmask`). The
engine builds the step's mask after scheduling (`SchedulerOutput.logits_mask`); the runner
applies it to the sampling rows' logits before the sampler runs, and nothing else in the
plain path knows about grammars. A step with nothing to mask has `NoLogitsMask`, which gives
its logits as they are, so the runner applies a mask to every step without asking.
"""

from __future__ import annotations

from typing import Protocol

import torch


class LogitsMask(Protocol):
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` ([num_rows, vocab], the step's sampling rows) with the masked tokens at
        -inf (in place)."""
        ...


class NoLogitsMask:
    """The mask of a step with nothing to mask."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
