"""Extra tokens: what a part adds to each running request's step, past the request's own tokens.

The scheduler gives a running request its own tokens to compute. A part may ask for more, and
the scheduler asks it through this one object, built once by the composition root
(`engine/setup.py`):

- `tokens_after(request)`: tokens to compute after the request's own this step, as ordinary
  tokens (speculative decoding's proposals, `spec_decode/speculator.py`, which the sampler then
  verifies). The token budget may cut some; the step samples a row for each that it keeps.
- `num_slots_after`: KV slots every request holds past its step's tokens, never cached (where a
  draft model writes the KV of what it proposes next: vLLM's `num_lookahead_tokens`).

The plain engine's, `ExtraTokens()`, adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nanovllm.request import Request


def no_tokens(request: Request) -> list[int]:
    """No request has tokens past its own."""
    return []


@dataclass(frozen=True)
class ExtraTokens:
    tokens_after: Callable[[Request], list[int]] = no_tokens
    num_slots_after: int = 0
