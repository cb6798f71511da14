"""Lesson 17 planted bugs: a router that picks or weighs the wrong experts, a dispatch that loses
or reorders pairs, and a layer that sends a token's rows to the wrong place or weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanovllm.lessons.testing import Mutant, variant


def _select(router_logits, top_k, renormalize, *, bug=""):
    logits = router_logits if bug == "softmax-in-bfloat16" else router_logits.float()
    if bug == "weights-are-logits":
        weights, ids = torch.topk(logits, top_k, dim=-1)
        return weights.float(), ids
    if bug == "softmax-over-the-tokens":
        probs = torch.softmax(logits, dim=0)
    elif bug == "softmax-over-the-chosen-only":  # renormalises whatever `renormalize` says
        chosen, ids = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(chosen, dim=-1), ids
    else:
        probs = torch.softmax(logits, dim=-1).float()
    weights, ids = torch.topk(probs, top_k, dim=-1, largest=bug != "least-probable")
    if bug == "least-probable-first":
        weights, ids = weights.flip(-1), ids.flip(-1)
    if (renormalize and bug != "never-renormalises") or bug == "always-renormalises":
        total = weights.sum() if bug == "renormalises-over-the-batch" else weights.sum(-1, True)
        weights = weights / total
    return weights, ids


def _sort(topk_ids, num_experts, *, bug=""):
    pair_ids = topk_ids.flatten()
    if bug == "sorted-by-token":
        order = torch.arange(pair_ids.numel())
    elif bug == "experts-descending":
        order = torch.argsort(-pair_ids, stable=True)
    elif bug == "tokens-reversed-in-an-expert":
        flipped = torch.argsort(pair_ids.flip(0), stable=True)
        order = pair_ids.numel() - 1 - flipped
    elif bug == "sorts-each-tokens-slots":
        order = (
            torch.argsort(topk_ids, dim=-1)
            + torch.arange(topk_ids.shape[0])[:, None] * topk_ids.shape[1]
        ).flatten()
    else:
        order = torch.argsort(pair_ids, stable=True)
    if bug == "counts-without-empty-last-experts":
        return order, torch.bincount(pair_ids)
    if bug == "counts-per-token":
        return order, torch.bincount(pair_ids[:: topk_ids.shape[1]], minlength=num_experts)
    return order, torch.bincount(pair_ids, minlength=num_experts)


def _fused(hidden_states, w13_weight, w2_weight, topk_weights, topk_ids, *, bug=""):
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros_like(hidden_states)
    pair_ids = topk_ids.flatten()
    order = torch.argsort(pair_ids, stable=True)
    counts = torch.bincount(pair_ids, minlength=w13_weight.shape[0]).tolist()
    if bug == "skips-the-last-expert":
        counts = counts[:-1]
    start = 0
    for expert, count in enumerate(counts):
        pairs = order[start : start + count]
        start += count
        if count == 0 or (bug == "skips-experts-with-one-token" and count == 1):
            continue
        tokens = pairs % num_tokens if bug == "token-is-pair-mod-tokens" else pairs // top_k
        x = hidden_states[tokens]
        gate, up = F.linear(x, w13_weight[expert]).chunk(2, dim=-1)
        if bug == "up-gated-not-gate":
            gate, up = up, gate
        y = F.linear(F.silu(gate) * up, w2_weight[expert])
        flat = topk_weights.flatten()
        if bug == "weight-of-the-tokens-first-slot":
            weights = flat[tokens * top_k]
        elif bug == "weight-by-token-index":
            weights = flat[tokens]
        else:
            weights = flat[pairs]
        if bug == "ignores-the-weights":
            weights = torch.ones_like(weights)
        y = (y * weights.unsqueeze(1)).to(out.dtype)
        if bug == "overwrites-the-tokens-row":
            out[tokens] = y
        else:
            out.index_add_(0, tokens, y)
    return out


_BUGGY = {"select_experts": _select, "sort_by_expert": _sort, "fused_experts": _fused}


def _m(name: str, description: str, fn: str) -> Mutant:
    """The reference with `fn` replaced by its version above with bug `name`."""
    buggy = _BUGGY[fn]
    return Mutant(
        name, description, lambda ref: variant(ref, **{fn: lambda *a: buggy(*a, bug=name)})
    )


MUTANTS = [
    _m("weights-are-logits", "the weights are the top logits, no softmax", "select_experts"),
    _m("softmax-over-the-tokens", "softmax along the tokens, not the experts", "select_experts"),
    _m("softmax-over-the-chosen-only", "a softmax of the k chosen logits: always renormalised",
       "select_experts"),
    _m("softmax-in-bfloat16", "the softmax in the logits' own dtype", "select_experts"),
    _m("least-probable", "the k least probable experts", "select_experts"),
    _m("least-probable-first", "the k experts in rising weight", "select_experts"),
    _m("never-renormalises", "renormalize ignored: never", "select_experts"),
    _m("always-renormalises", "renormalize ignored: always", "select_experts"),
    _m("renormalises-over-the-batch", "divided by the whole batch's sum", "select_experts"),
    _m("sorted-by-token", "the pairs left in token order", "sort_by_expert"),
    _m("experts-descending", "the last expert's pairs first", "sort_by_expert"),
    _m("tokens-reversed-in-an-expert", "within an expert, the last token first",
       "sort_by_expert"),
    _m("sorts-each-tokens-slots", "each token's slots sorted, not all pairs",
       "sort_by_expert"),
    _m("counts-without-empty-last-experts", "bincount without minlength",
       "sort_by_expert"),
    _m("counts-per-token", "counts each token's first slot only", "sort_by_expert"),
    _m("skips-the-last-expert", "the last expert never runs", "fused_experts"),
    _m("skips-experts-with-one-token", "an expert with one pair skipped", "fused_experts"),
    _m("token-is-pair-mod-tokens", "pair p taken as token p % num_tokens", "fused_experts"),
    _m("up-gated-not-gate", "silu(up) * gate", "fused_experts"),
    _m("weight-of-the-tokens-first-slot", "every expert of a token weighted by its first slot's",
       "fused_experts"),
    _m("weight-by-token-index", "the weight at the token's index, not the pair's",
       "fused_experts"),
    _m("ignores-the-weights", "every expert's output added at weight 1", "fused_experts"),
    _m("overwrites-the-tokens-row", "out[tokens] = y: a token's last expert wins",
       "fused_experts"),
]  # fmt: skip
