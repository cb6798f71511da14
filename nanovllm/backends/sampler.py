"""The sampler's fast paths: numpy's argmax on a CPU, and a shortcut for all-greedy steps.

The plain `Sampler` (`executor/sampler.py`) runs every step the same way: logits processors,
greedy tokens, filters for random rows, verification, logprobs. Most steps of a greedy workload
need only the first of those, so `FastSampler` answers them at once: when every request is
greedy, has no tokens to verify, asks for no logprobs and no row is bad (NaN, or all -inf), each
request's token is its row's argmax. On a CPU the argmax itself is numpy's, faster than torch's
`max` with indices (nanovllm/bench/README.md). A backend's runner is given this sampler when it
is built; `tests/test_sampler.py` checks both against the plain one.
"""

from __future__ import annotations

import numpy as np
import torch

from nanovllm.executor.logits_processors import apply_logits_processors
from nanovllm.executor.outputs import SamplerOutput
from nanovllm.executor.sampler import Sampler, greedy_tokens
from nanovllm.request import Request


def fast_greedy_tokens(logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """`greedy_tokens` (`executor/sampler.py`), with numpy's argmax for fp32 logits on a CPU: it
    too gives the first index of a tied maximum and stops at the first NaN, which it ranks above
    everything, so the row's value at that index says whether the row is bad."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        rows = logits.numpy()  # [num_rows, vocab], the same memory
        argmax = rows.argmax(axis=1)  # [num_rows]
        best = torch.from_numpy(rows[np.arange(len(argmax)), argmax])  # [num_rows]
        return argmax.tolist(), torch.isnan(best) | (best == float("-inf"))
    return greedy_tokens(logits)


def _plain_greedy(requests: list[Request], to_verify: list[list[int]] | None) -> bool:
    """Whether every request is greedy, verifies nothing and asks for no logprobs."""
    return not any(to_verify or ()) and all(
        r.sampling_params.greedy and r.sampling_params.logprobs is None for r in requests
    )


class FastSampler(Sampler):
    """The plain sampler with the fast paths of the module docstring."""

    greedy_tokens = staticmethod(fast_greedy_tokens)

    def __call__(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        to_verify: list[list[int]] | None = None,
    ) -> SamplerOutput:
        if _plain_greedy(requests, to_verify):
            processed = apply_logits_processors(logits, requests)
            argmax, bad = self.greedy_tokens(processed)  # [num_rows] each
            if not bad.any():
                # An all-greedy step: one row per request, its argmax, nothing else asked for.
                return SamplerOutput([[token] for token in argmax], [None] * len(requests))
        return super().__call__(logits, requests, to_verify)
