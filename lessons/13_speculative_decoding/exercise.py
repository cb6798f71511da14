"""Lesson 13 exercise: verifying proposed tokens, greedily and by rejection sampling.

Check with `nanovllm lesson 13 --check`.
"""

from __future__ import annotations

import torch


def verify_greedy(target_argmax: list[int], draft_token_ids: list[int]) -> list[int]:
    """Which proposed tokens greedy decoding keeps, and the one token that follows them.

    draft_token_ids: the s proposed tokens x_1 .. x_s (s may be 0).
    target_argmax: s + 1 tokens from one forward pass of the target model: target_argmax[i] is
    its most likely token at the position of x_{i+1}, computed with x_1 .. x_i before it; the
    last, target_argmax[s], is its most likely token after x_s.

    Accept the proposals from the first on while each equals the target's argmax at its
    position. At the first that does not, emit the target's argmax there instead (the
    correction) and stop. If all s are accepted, emit target_argmax[s] as well (the bonus).
    Return the emitted tokens, accepted proposals first: between 1 and s + 1 of them.
    Do not modify the arguments.
    """
    raise NotImplementedError("write verify_greedy (lesson 13)")


def verify_random(
    target_probs: torch.Tensor,
    draft_token_ids: list[int],
    generator: torch.Generator,
    draft_probs: torch.Tensor | None = None,
) -> list[int]:
    """Rejection sampling: emit tokens distributed exactly as the target model would sample them.

    target_probs: [s + 1, vocab] float, rows summing to 1. Row i is p_{i+1}, the target's
    distribution at the position of x_{i+1} (given x_1 .. x_i); row s is the one after x_s.
    draft_token_ids: the s proposed tokens x_1 .. x_s (s may be 0).
    generator: draw every random number from it (`torch.rand(n, generator=generator)`,
    `torch.multinomial(weights, 1, generator=generator)`), never from torch's global one: a
    seeded request must give the same tokens every time.
    draft_probs: [s, vocab], row i the distribution q_{i+1} the proposer drew x_{i+1} from (a
    draft model); None for a proposer that is certain (the n-gram lookup): then q_i is 1 at x_i
    and 0 everywhere else.

    For i = 1 .. s in turn: draw u uniform in [0, 1) and accept x_i if u * q_i(x_i) < p_i(x_i),
    i.e. with probability min(1, p_i(x_i) / q_i(x_i)). At the first rejection, emit a token
    drawn from the residual max(0, p_i - q_i) (normalised: weights proportional to it) and stop.
    If the residual is all zeros (only float rounding can make it so), draw from p_i instead.
    If all s are accepted, emit a token drawn from p_{s+1} (the bonus). Return the emitted
    tokens, accepted proposals first: between 1 and s + 1 of them. Do not modify the arguments.
    """
    raise NotImplementedError("write verify_random (lesson 13)")
