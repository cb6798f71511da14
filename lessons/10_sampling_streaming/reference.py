"""Lesson 10 reference: the engine's `apply_filters` and `IncrementalDetokenizer.step`.

`apply_filters` takes per-row parameters for top-k, top-p and min-p at once; each adapter turns
the other two filters off: top-k = vocab, min-p = 0, and top-p = infinity. (Not 1.0: the engine
applies its top-p rule even at p = 1, and in float32 the cumulative probability reaches exactly
1.0 before the last tokens of a peaked row, so those, with probabilities near 1e-26, would be
dropped as well.)
"""

from __future__ import annotations

import torch

from nanovllm.engine.detokenizer import DetokenizerState, IncrementalDetokenizer
from nanovllm.executor.sampler import apply_filters

__all__ = ["apply_top_k", "apply_top_p", "detokenize_step"]


def _filters(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The engine's filters with top-k `top_k` and top-p `top_p` (min-p off)."""
    rows, vocab = logits.shape
    return apply_filters(
        logits,
        torch.full((rows,), min(top_k, vocab)),
        torch.full((rows,), float(top_p)),
        torch.zeros(rows),
    )


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    return _filters(logits, k, float("inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    return _filters(logits, logits.shape[-1], p)


def detokenize_step(tokenizer, state: DetokenizerState, output_ids: list[int]) -> str:
    return IncrementalDetokenizer(tokenizer).step(state, output_ids)
