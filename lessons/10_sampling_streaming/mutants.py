"""Lesson 10 planted bugs: filters that keep the wrong tokens, streams that break text."""

from __future__ import annotations

import torch

from nanovllm.lessons.testing import Mutant, variant


def _top_k(logits, k, *, bug=""):
    vocab = logits.shape[-1]
    if bug in ("top-k-one-extra", "top-k-smallest", "top-k-drops-ties"):
        keep = min(k + 1 if bug == "top-k-one-extra" else k, vocab)
        idx = logits.topk(keep, dim=-1, largest=bug != "top-k-smallest").indices
        mask = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, idx, True)
        return logits.masked_fill(~mask, float("-inf"))
    kth = logits.topk(min(k, vocab), dim=-1).values[:, -1:]
    if bug == "top-k-in-place":
        return logits.masked_fill_(logits < kth, float("-inf"))  # the caller's tensor, masked
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits, p, *, bug=""):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    if bug == "top-p-softmax-twice":
        probs = probs.softmax(-1)  # a much flatter distribution: keeps far too many tokens
    cum = probs.cumsum(-1)
    if bug == "top-p-drops-the-crossing-token":
        drop = cum > p  # also drops the token that carries the sum over p
    elif bug == "top-p-may-keep-nothing":
        drop = cum - probs >= p
        drop[:, 0] = probs[:, 0] < p  # the top token is dropped when it alone is not enough
    else:
        drop = cum - probs >= p
    masked = sorted_logits.masked_fill(drop, float("-inf"))
    if bug == "top-p-in-place":
        return logits.scatter_(-1, order, masked)  # written back into the caller's tensor
    return torch.full_like(logits, float("-inf")).scatter(-1, order, masked)


def _naive_detok(tokenizer, state, output_ids):
    """Decodes only the newest token: loses leading spaces, emits half characters."""
    delta = tokenizer.decode(output_ids[-1:])
    state.text += delta
    return delta


def _unguarded_detok(tokenizer, state, output_ids):
    """The window algorithm without the half-character check."""
    prefix = tokenizer.decode(output_ids[state.prefix_offset : state.read_offset])
    new = tokenizer.decode(output_ids[state.prefix_offset :])
    if len(new) <= len(prefix):
        return ""
    delta = new[len(prefix) :]
    state.text += delta
    state.prefix_offset, state.read_offset = state.read_offset, len(output_ids)
    return delta


def _decode_everything(tokenizer, state, output_ids):
    """Correct text, but decodes the whole output every step: O(n) per token."""
    text = tokenizer.decode(output_ids)
    if text.endswith("\ufffd") or len(text) <= len(state.text):
        return ""
    delta = text[len(state.text) :]
    state.text = text
    return delta


def _k(name, description):
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, apply_top_k=lambda lg, k: _top_k(lg, k, bug=name)),
    )


def _p(name, description):
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, apply_top_p=lambda lg, p: _top_p(lg, p, bug=name)),
    )


def _d(name, description, fn):
    return Mutant(name, description, lambda ref: variant(ref, detokenize_step=fn))


MUTANTS = [
    _k("top-k-one-extra", "top-k keeps k + 1 tokens"),
    _k("top-k-smallest", "top-k keeps the k smallest logits"),
    _k("top-k-drops-ties", "top-k keeps exactly k tokens, dropping some tied with the k-th"),
    _k("top-k-in-place", "top-k masks the caller's logits in place (masked_fill_)"),
    _p("top-p-in-place", "top-p writes its result into the caller's logits"),
    _p("top-p-drops-the-crossing-token", "top-p drops the token that brings the sum to p"),
    _p("top-p-may-keep-nothing", "top-p can drop even the most likely token"),
    _p("top-p-softmax-twice", "top-p sums a softmax of the probabilities (far too flat)"),
    _d("detok-token-by-token", "each token is decoded alone", _naive_detok),
    _d("detok-streams-half-characters", "no check for a trailing U+FFFD", _unguarded_detok),
    _d("detok-decodes-everything", "the whole output is decoded at every step", _decode_everything),
]
