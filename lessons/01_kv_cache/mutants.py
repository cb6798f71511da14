"""Lesson 01 planted bugs: the attention and cache mistakes the properties must catch."""

from __future__ import annotations

import torch

from nanovllm.lessons.testing import Mutant, variant


def _attention(q, k, v, scale, *, shift: int = 0, mask: bool = True, softmax_dim: int = -1):
    """Plain causal attention with knobs to break it. shift=-1 hides a query from itself."""
    q_len, kv_len = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if mask:
        q_pos = torch.arange(kv_len - q_len, kv_len)
        allowed = torch.arange(kv_len)[None, :] <= q_pos[:, None] + shift
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = scores.softmax(dim=softmax_dim)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def _scales_q_in_place(q, k, v, scale):
    """The right output, but the caller's queries are scaled in place (q.mul_)."""
    return _attention(q.mul_(scale), k, v, 1.0)


def _unstable_attention(q, k, v, scale):
    """softmax written as exp / sum, without subtracting the maximum: overflows to inf/inf."""
    q_len, kv_len = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    q_pos = torch.arange(kv_len - q_len, kv_len)
    allowed = torch.arange(kv_len)[None, :] <= q_pos[:, None]
    weights = scores.exp() * allowed
    probs = weights / weights.sum(-1, keepdim=True)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


class _OverwritingCache:
    """append() replaces the cache instead of extending it."""

    def __init__(self, num_heads, head_dim, dtype=torch.float32):
        self.keys = torch.empty(0, num_heads, head_dim, dtype=dtype)
        self.values = torch.empty(0, num_heads, head_dim, dtype=dtype)

    def __len__(self):
        return self.keys.shape[0]

    def append(self, k, v):
        self.keys, self.values = k.clone(), v.clone()


def _attend_then_append(reference):
    def decode_step(cache, q, k, v, scale):
        if len(cache) == 0:
            out = torch.zeros_like(q)  # nothing cached yet to attend to
        else:
            out = _attention(q, cache.keys, cache.values, scale, mask=False)
        cache.append(k, v)
        return out

    return variant(reference, decode_step=decode_step)


# --- Learner mistakes: wrong solutions written as a learner writes them (issue #52), kept so that
# the properties go on catching them.


def _head_dim_scale(q, k, v, scale):
    """Ignores `scale`: always head_dim ** -0.5, the value the engine usually passes."""
    return _attention(q, k, v, q.shape[-1] ** -0.5)


def _decode_scales_q_in_place(reference):
    def decode_step(cache, q, k, v, scale):
        cache.append(k, v)
        q *= scale  # the caller's query, scaled in place
        return _attention(q, cache.keys, cache.values, 1.0, mask=False)

    return variant(reference, decode_step=decode_step)


MUTANTS = [
    Mutant(
        "scales-q-in-place",
        "attention scales the caller's queries in place (q.mul_(scale)): right output, q changed",
        lambda ref: variant(ref, attention=_scales_q_in_place),
    ),
    Mutant(
        "no-causal-mask",
        "attention lets every query see every position, the future included",
        lambda ref: variant(ref, attention=lambda q, k, v, s: _attention(q, k, v, s, mask=False)),
    ),
    Mutant(
        "mask-off-by-one",
        "the causal mask hides each query's own position",
        lambda ref: variant(ref, attention=lambda q, k, v, s: _attention(q, k, v, s, shift=-1)),
    ),
    Mutant(
        "mask-lets-one-future-token-through",
        "the causal mask is one position too generous",
        lambda ref: variant(ref, attention=lambda q, k, v, s: _attention(q, k, v, s, shift=1)),
    ),
    Mutant(
        "no-scale",
        "scores are not multiplied by the scale",
        lambda ref: variant(ref, attention=lambda q, k, v, s: _attention(q, k, v, 1.0)),
    ),
    Mutant(
        "softmax-over-queries",
        "softmax normalises over the query axis instead of the key axis",
        lambda ref: variant(
            ref, attention=lambda q, k, v, s: _attention(q, k, v, s, softmax_dim=-2)
        ),
    ),
    Mutant(
        "unstable-softmax",
        "softmax computed as exp(s) / sum(exp(s)) without subtracting the maximum",
        lambda ref: variant(ref, attention=_unstable_attention),
    ),
    Mutant(
        "append-overwrites",
        "KVCache.append replaces the cached tokens instead of adding to them",
        lambda ref: variant(ref, KVCache=_OverwritingCache),
    ),
    Mutant(
        "attend-before-append",
        "decode_step attends before storing the new token: it never sees itself",
        _attend_then_append,
    ),
    Mutant(
        "learner-ignores-scale",
        "attention uses head_dim ** -0.5 instead of the scale it is given",
        lambda ref: variant(ref, attention=_head_dim_scale),
    ),
    Mutant(
        "learner-decode-scales-q-in-place",
        "decode_step scales the caller's query in place (q *= scale), then attends with 1.0",
        _decode_scales_q_in_place,
    ),
]
