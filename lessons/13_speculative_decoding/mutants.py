"""Lesson 13 planted bugs: verification rules that emit too much, too little, or the wrong
distribution."""

from __future__ import annotations

import torch

from nanovllm.executor.rejection_sampler import draw
from nanovllm.lessons.testing import Mutant, variant


def _greedy(target_argmax, draft_token_ids, *, bug=""):
    emitted = []
    for i, draft in enumerate(draft_token_ids):
        target = target_argmax[i + 1 if bug == "greedy-compares-the-next-position" else i]
        if draft != target:
            if bug == "greedy-emits-the-rejected-proposal":
                emitted.append(draft)
            elif bug != "greedy-no-correction":
                emitted.append(target_argmax[i])
            if bug != "greedy-keeps-going":
                return emitted
            continue
        emitted.append(draft)
    if bug != "greedy-no-bonus":
        emitted.append(target_argmax[len(draft_token_ids)])
    return emitted


def _greedy_into_the_proposals(target_argmax, draft_token_ids):
    """Right tokens, but built in the caller's list of proposals."""
    a = 0
    while a < len(draft_token_ids) and draft_token_ids[a] == target_argmax[a]:
        a += 1
    del draft_token_ids[a:]
    draft_token_ids.append(target_argmax[a])
    return draft_token_ids


def _random(target_probs, draft_token_ids, generator, draft_probs=None, *, bug=""):
    s = len(draft_token_ids)
    if bug == "random-global-rng":
        uniforms = torch.rand(s).tolist()
    else:
        uniforms = torch.rand(s, generator=generator).tolist()
    emitted = []
    for i, x in enumerate(draft_token_ids):
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else None
        q_x = float(q[x]) if q is not None else 1.0
        if bug == "random-accepts-everything":
            accepted = True
        elif bug == "random-accepts-with-p-alone":
            accepted = uniforms[i] < float(p[x])
        elif bug == "random-accepts-with-q-over-p":
            accepted = uniforms[i] * float(p[x]) < q_x
        else:
            accepted = uniforms[i] * q_x < float(p[x])
        if accepted:
            emitted.append(x)
            continue
        if bug == "random-redraws-from-p":
            residual = p
        elif bug == "random-zeroes-p-in-place" and q is None:
            residual = p
            residual[x] = 0.0  # the caller's tensor
        else:
            onehot = torch.zeros_like(p)
            onehot[x] = 1.0
            residual = (p - (q if q is not None else onehot)).clamp(min=0.0)
            if bug == "random-residual-backwards":
                residual = ((q if q is not None else onehot) - p).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:
            residual = p
        if bug == "random-correction-is-the-argmax":
            emitted.append(int(residual.argmax()))
        else:
            emitted.append(draw(residual, generator))
        return emitted
    if bug != "random-no-bonus":
        bonus_row = s - 1 if bug == "random-bonus-from-the-last-proposal-row" and s else s
        emitted.append(draw(target_probs[bonus_row], generator))
    return emitted


def _g(name, description):
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, verify_greedy=lambda t, d: _greedy(t, d, bug=name)),
    )


def _r(name, description):
    return Mutant(
        name,
        description,
        lambda ref: variant(
            ref, verify_random=lambda p, d, g, q=None: _random(p, d, g, q, bug=name)
        ),
    )


MUTANTS = [
    _g("greedy-no-bonus", "all proposals accepted, but no bonus token after them"),
    _g("greedy-emits-the-rejected-proposal", "at a mismatch, emits the proposal, not the target's"),
    _g("greedy-no-correction", "at a mismatch, stops without emitting the target's token"),
    _g("greedy-keeps-going", "goes on verifying after a mismatch"),
    _g("greedy-compares-the-next-position", "checks proposal i against the argmax one further on"),
    Mutant(
        "greedy-builds-in-the-proposals",
        "right tokens, but written into the caller's list of proposals",
        lambda ref: variant(ref, verify_greedy=_greedy_into_the_proposals),
    ),
    _r("random-accepts-everything", "every proposal is accepted"),
    _r("random-accepts-with-p-alone", "accepts with probability p(x), ignoring q(x)"),
    _r("random-accepts-with-q-over-p", "accepts with probability min(1, q(x) / p(x))"),
    _r("random-redraws-from-p", "after a rejection, draws from p, not the residual"),
    _r("random-residual-backwards", "after a rejection, draws from max(0, q - p)"),
    _r("random-correction-is-the-argmax", "after a rejection, takes the residual's argmax"),
    _r("random-no-bonus", "all proposals accepted, but no bonus token after them"),
    _r(
        "random-bonus-from-the-last-proposal-row",
        "the bonus is drawn from p_s, the last proposal's row, not p_{s+1}",
    ),
    _r("random-global-rng", "the accept/reject uniforms come from torch's global generator"),
    _r("random-zeroes-p-in-place", "builds the n-gram residual by zeroing p(x) in target_probs"),
]
