"""Verifying proposed tokens so that the output is exactly what the target model would sample.

A proposer (an n-gram lookup, or a small draft model) guesses s tokens x_1..x_s. One forward
pass of the target model over [last token, x_1, ..., x_s] gives its distribution p_1 .. p_{s+1}
for each of those positions at once: p_i is the next-token distribution *given* x_1..x_{i-1}.

Greedy: accept x_i while it equals argmax p_i. At the first mismatch, emit argmax p_i instead
and stop; if all s are accepted, emit argmax p_{s+1} as a bonus. Either way a step emits
between 1 and s + 1 tokens, and exactly the tokens plain greedy decoding would have produced.

Random (Leviathan et al., 2023; Chen et al., 2023): with q_i the proposer's distribution for
x_i (a point mass, q_i(x_i) = 1, for the n-gram proposer), accept x_i with probability
min(1, p_i(x_i) / q_i(x_i)). On the first rejection, draw instead from the residual
max(0, p_i - q_i), renormalised, and stop; if all are accepted, draw the bonus from p_{s+1}.
Each emitted token is then distributed exactly as p: P(emit y) = min(p(y), q(y)) [accepted]
+ (1 - sum_z min(p(z), q(z))) x residual(y) [rejected] = p(y).

Here p is the *processed* distribution (temperature, min-p, top-k, top-p applied), the one
the request samples from. Draws come from the request's own generator, in a fixed order (s
uniforms, then one exponential-race draw), so a seeded request stays reproducible.
"""

from __future__ import annotations

import torch


def draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """A token drawn with probability proportional to `weights` ([vocab], >= 0): the exponential
    race (`executor/sampler.py`), which needs no normalisation."""
    noise = torch.empty_like(weights).exponential_(generator=generator)
    return int((weights / noise.clamp(min=torch.finfo(noise.dtype).tiny)).argmax())


def verify_greedy(target_argmax: list[int], draft_token_ids: list[int]) -> list[int]:
    """target_argmax: argmax p_1 .. p_{s+1}. Returns the emitted tokens (1 to s + 1)."""
    emitted = []
    for draft, target in zip(draft_token_ids, target_argmax):
        emitted.append(target)
        if draft != target:
            return emitted  # the correction
    emitted.append(target_argmax[len(draft_token_ids)])  # all accepted: the bonus token
    return emitted


def verify_random(
    target_probs: torch.Tensor,  # [s + 1, vocab]: p_1 .. p_{s+1}
    draft_token_ids: list[int],  # x_1 .. x_s
    generator: torch.Generator,
    draft_probs: torch.Tensor | None = None,  # [s, vocab]: q_1 .. q_s; None: point masses
) -> list[int]:
    """Rejection sampling (see the module docstring). Returns the emitted tokens (1 to s + 1)."""
    s = len(draft_token_ids)
    uniforms = torch.rand(s, generator=generator, device=target_probs.device).tolist()
    emitted = []
    for i, x in enumerate(draft_token_ids):
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else None
        q_x = float(q[x]) if q is not None else 1.0
        if uniforms[i] * q_x < float(p[x]):  # accepted with probability min(1, p(x) / q(x))
            emitted.append(x)
            continue
        if q is None:
            residual = p.clone()
            residual[x] = 0.0  # max(0, p - onehot(x)): p without x
        else:
            residual = (p - q).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p will do
            residual = p
        emitted.append(draw(residual, generator))
        return emitted
    emitted.append(draw(target_probs[s], generator))  # all accepted: the bonus token
    return emitted


class RejectionVerifier:
    """The sampler's verifier (`executor/sampler.py`): a request's rows -> its new tokens, by the
    rules above. A lesson or a test may give the sampler another one."""

    def greedy(self, target_argmax: list[int], token_ids: list[int]) -> list[int]:
        return verify_greedy(target_argmax, token_ids)

    def random(
        self, target_probs: torch.Tensor, token_ids: list[int], generator: torch.Generator
    ) -> list[int]:
        return verify_random(target_probs, token_ids, generator)
