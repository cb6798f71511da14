"""Lesson 17 properties: every token reaches exactly its top-k experts, with the model's weights.

Each property takes the implementation as `impl` and checks it against an oracle written here,
independently of the engine: the router's rule in float64 from the logits (a softmax over all
experts, the k largest, renormalised or not), the dispatch's order as Python's `sorted` of the
pairs by (expert, pair index), and the layer against `fused_experts_ref`
(`nanovllm/kernels/fused_moe_reference.py`, one expert at a time, tested against every expert
run on every token) or, from the router's logits, against every expert computed on every token
in float64 and weighted by the oracle's own choice.

Every tensor is small, and the router's logits are distinct in each row (in bfloat16, values
on a grid it holds exactly), so "the k most probable" is one answer, never a tie.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.kernels.fused_moe_reference import fused_experts_ref
from nanovllm.lessons.strategies import seeds
from nanovllm.lessons.testing import lesson_settings, returned, show_inputs


class RouterCase(NamedTuple):
    """Router logits [num_tokens, num_experts] (made from `seed`), and the rule's switches."""

    num_tokens: int
    num_experts: int
    top_k: int
    renormalize: bool
    dtype: str  # "float32" or "bfloat16"
    scale: float  # the logits' spread (float32): a peaked or a flat router
    seed: int

    def logits(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed)
        n, e = self.num_tokens, self.num_experts
        if self.dtype == "float32":
            return torch.randn(n, e, generator=gen) * self.scale
        # bfloat16: each row a shuffle of distinct multiples of 1/4 (held exactly), so no ties.
        rows = [torch.randperm(e, generator=gen) for _ in range(n)]
        grid = torch.stack(rows).float() - e / 2
        return (grid * 0.25 * max(self.scale, 1.0)).to(torch.bfloat16)


class Pairs(NamedTuple):
    """topk_ids [num_tokens, top_k]: each token's distinct experts, drawn among the first
    `num_used` of `num_experts` (so the last experts may get no pair at all)."""

    num_tokens: int
    num_experts: int
    top_k: int
    num_used: int
    dtype: str  # "int64" or "int32"
    seed: int

    def topk_ids(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed)
        rows = [
            torch.randperm(self.num_used, generator=gen)[: self.top_k]
            for _ in range(self.num_tokens)
        ]
        ids = torch.stack(rows) if rows else torch.zeros(0, self.top_k, dtype=torch.int64)
        return ids.to(getattr(torch, self.dtype))


class Layer(NamedTuple):
    """A layer's inputs: tokens [num_tokens, hidden], E experts of intermediate size I, and a
    routing (`pairs`) with weights (`weights`: "random", "one-hot" on one slot, or "ones")."""

    pairs: Pairs
    hidden: int
    intermediate: int
    weights: str
    dtype: str  # "float32" or "bfloat16" (the tokens and experts)
    seed: int

    def tensors(self):
        gen = torch.Generator().manual_seed(self.seed)
        n, k, e = self.pairs.num_tokens, self.pairs.top_k, self.pairs.num_experts
        h, i = self.hidden, self.intermediate
        x = torch.randn(n, h, generator=gen)
        w13 = torch.randn(e, 2 * i, h, generator=gen) * 0.5
        w2 = torch.randn(e, h, i, generator=gen) * 0.5
        if self.weights == "random":
            weights = torch.rand(n, k, generator=gen) * 2 - 0.5
        elif self.weights == "ones":
            weights = torch.ones(n, k)
        else:  # one slot per token, the others 0: the output is that one expert's
            slot = torch.randint(0, k, (n,), generator=gen)
            weights = F.one_hot(slot, k).float()
        dtype = getattr(torch, self.dtype)
        return x.to(dtype), w13.to(dtype), w2.to(dtype), weights, self.pairs.topk_ids()


@st.composite
def router_cases(draw) -> RouterCase:
    num_experts = draw(st.integers(1, 8), label="num_experts")
    return RouterCase(
        draw(st.integers(1, 6), label="num_tokens"),
        num_experts,
        draw(st.integers(1, num_experts), label="top_k"),
        draw(st.booleans(), label="renormalize"),
        draw(st.sampled_from(["float32", "float32", "bfloat16"]), label="dtype"),
        draw(st.sampled_from([0.1, 1.0, 4.0]), label="scale"),
        draw(seeds, label="seed"),
    )


@st.composite
def pair_cases(draw, max_tokens: int = 10) -> Pairs:
    num_experts = draw(st.integers(1, 8), label="num_experts")
    top_k = draw(st.integers(1, num_experts), label="top_k")
    return Pairs(
        draw(st.integers(1, max_tokens), label="num_tokens"),
        num_experts,
        top_k,
        draw(st.integers(top_k, num_experts), label="num_used"),
        draw(st.sampled_from(["int64", "int32"]), label="dtype"),
        draw(seeds, label="seed"),
    )


@st.composite
def layer_cases(draw) -> Layer:
    return Layer(
        draw(pair_cases(max_tokens=6), label="pairs"),
        draw(st.integers(1, 6), label="hidden"),
        draw(st.integers(1, 4), label="intermediate"),
        draw(st.sampled_from(["random", "random", "one-hot", "ones"]), label="weights"),
        draw(st.sampled_from(["float32", "float32", "float32", "bfloat16"]), label="dtype"),
        draw(seeds, label="seed"),
    )


def _router_oracle(logits: torch.Tensor, top_k: int, renormalize: bool):
    """The rule in float64: (weights [n, k], ids [n, k] as lists), experts in falling weight."""
    probs = torch.softmax(logits.double(), dim=-1).tolist()
    weights, ids = [], []
    for row in probs:
        best = sorted(range(len(row)), key=lambda e: -row[e])[:top_k]
        chosen = [row[e] for e in best]
        total = sum(chosen) if renormalize else 1.0
        weights.append([p / total for p in chosen])
        ids.append(best)
    return weights, ids


def _expert_f64(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert in float64: x [m, H], w13 [2I, H], w2 [H, I] -> [m, H]."""
    gate, up = (x.double() @ w13.double().T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w2.double().T


# --- select_experts -----------------------------------------------------------------------------


def _selected(impl, case: RouterCase):
    logits = case.logits()
    before = logits.clone()
    weights, ids = returned(
        "select_experts returned", impl.select_experts(logits, case.top_k, case.renormalize)
    )
    assert torch.equal(logits, before), "select_experts modified the router_logits it was given"
    n, k = case.num_tokens, case.top_k
    for name, got, dtype in (
        ("topk_weights", weights, torch.float32),
        ("topk_ids", ids, torch.int64),
    ):
        assert (
            isinstance(got, torch.Tensor) and tuple(got.shape) == (n, k) and got.dtype == dtype
        ), (
            f"{name} should be a {dtype} tensor of shape {(n, k)} (num_tokens, top_k); got "
            f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}"
        )
    return logits, weights, ids


@lesson_settings(40)
@example(case=RouterCase(3, 4, 2, True, "float32", 1.0, 7))
@example(case=RouterCase(1, 4, 2, True, "float32", 1.0, 3))
@example(case=RouterCase(2, 8, 8, False, "bfloat16", 1.0, 5))
@given(case=router_cases())
@show_inputs
def test_each_token_gets_its_k_most_probable_experts(impl, case):
    """Every token gets exactly its top_k most probable experts, each once, in falling weight."""
    logits, _, ids = _selected(impl, case)
    _, want = _router_oracle(logits, case.top_k, case.renormalize)
    for t in range(case.num_tokens):
        got = ids[t].tolist()
        assert got == want[t], (
            f"token {t}: its logits are {[round(v, 3) for v in logits[t].float().tolist()]}, so "
            f"its {case.top_k} most probable experts, most probable first, are {want[t]}; got {got}"
        )


@lesson_settings(40)
@example(case=RouterCase(3, 4, 2, False, "float32", 1.0, 7))
@example(case=RouterCase(3, 4, 2, True, "float32", 1.0, 7))
@example(case=RouterCase(2, 6, 3, True, "bfloat16", 4.0, 11))
@given(case=router_cases())
@show_inputs
def test_the_weights_are_the_routers_probabilities(impl, case):
    """Each chosen expert's weight is its softmax probability over all the experts (computed in
    float32 from logits of any dtype), divided by the chosen ones' sum with `renormalize`."""
    logits, weights, _ = _selected(impl, case)
    want, ids = _router_oracle(logits, case.top_k, case.renormalize)
    want = torch.tensor(want, dtype=torch.float64)
    if not torch.allclose(weights.double(), want, rtol=1e-5, atol=1e-7):
        t = int((weights.double() - want).abs().amax(dim=-1).argmax())
        rule = (
            "their probabilities divided by their sum (they sum to 1)"
            if case.renormalize
            else "their softmax probabilities over all experts, not renormalised"
        )
        raise AssertionError(
            f"token {t} (logits {[round(v, 3) for v in logits[t].float().tolist()]}, "
            f"{case.dtype}): its experts {ids[t]} weigh {rule}: "
            f"{[round(w, 6) for w in want[t].tolist()]}; got "
            f"{[round(w, 6) for w in weights[t].tolist()]}"
        )


# --- sort_by_expert -----------------------------------------------------------------------------


@lesson_settings(40)
@example(case=Pairs(3, 4, 2, 4, "int64", 1))
@example(case=Pairs(5, 6, 2, 3, "int64", 2))
@example(case=Pairs(24, 4, 3, 4, "int32", 3))
@given(case=pair_cases(max_tokens=24))
@show_inputs
def test_pairs_are_sorted_by_expert_each_once(impl, case):
    """`order` holds every pair exactly once (scattered back, the sorted pairs are the pairs
    again), sorted by expert and then in token order; `counts` are each expert's pairs, the
    empty experts too, and add up to num_tokens * top_k."""
    topk_ids = case.topk_ids()
    before = topk_ids.clone()
    order, counts = returned(
        "sort_by_expert returned", impl.sort_by_expert(topk_ids, case.num_experts)
    )
    assert torch.equal(topk_ids, before), "sort_by_expert modified the topk_ids it was given"
    pairs = topk_ids.flatten().tolist()
    num_pairs = len(pairs)
    assert isinstance(order, torch.Tensor) and order.dtype == torch.int64, (
        f"order should be an int64 tensor; got {getattr(order, 'dtype', type(order).__name__)}"
    )
    assert tuple(order.shape) == (num_pairs,), (
        f"order holds one entry per (token, slot) pair: shape ({num_pairs},); got "
        f"{tuple(order.shape)}"
    )
    # The permutation round-trips: rows gathered in this order (sorted) and put back where each
    # came from (unsorted) are the rows again only if every pair is in it exactly once.
    listed = order.tolist()
    assert all(0 <= p < num_pairs for p in listed), (
        f"order names pairs outside 0..{num_pairs - 1}: {listed}"
    )
    times = Counter(listed)
    missing = [p for p in range(num_pairs) if p not in times]
    twice = sorted(p for p, n in times.items() if n > 1)
    assert not missing and not twice, (
        f"order must hold each pair once, so that unsort(sort(x)) == x; pairs {missing} are "
        f"missing and {twice} there more than once: {listed}"
    )
    want = sorted(range(num_pairs), key=lambda p: (pairs[p], p))
    assert listed == want, (
        f"the pairs' experts are {pairs} (pair p is token p // {case.top_k}'s slot p % "
        f"{case.top_k}): sorted by expert, each expert's pairs in token order, order is {want}; "
        f"got {listed} (experts {[pairs[p] for p in listed]})"
    )
    want_counts = [pairs.count(e) for e in range(case.num_experts)]
    assert isinstance(counts, torch.Tensor) and counts.dtype == torch.int64, (
        f"counts should be an int64 tensor; got {getattr(counts, 'dtype', type(counts).__name__)}"
    )
    assert counts.tolist() == want_counts and sum(want_counts) == num_pairs, (
        f"counts: each of the {case.num_experts} experts' pairs, {want_counts} (summing to "
        f"num_tokens * top_k = {num_pairs}); got {counts.tolist()}"
    )


# --- fused_experts ------------------------------------------------------------------------------


def _first_bad_row(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> int | None:
    bad = ~torch.isclose(got.double(), want.double(), atol=atol, rtol=rtol).all(dim=-1)
    return int(bad.nonzero()[0]) if bool(bad.any()) else None


@lesson_settings(40)
@example(case=Layer(Pairs(3, 4, 2, 4, "int64", 1), 4, 2, "random", "float32", 1))
@example(case=Layer(Pairs(4, 4, 2, 2, "int64", 2), 3, 2, "one-hot", "float32", 2))
@example(case=Layer(Pairs(2, 3, 1, 3, "int32", 3), 2, 1, "ones", "bfloat16", 3))
@given(case=layer_cases())
@show_inputs
def test_each_token_gets_its_experts_outputs_weighted(impl, case):
    """out[t] is the sum over t's slots j of topk_weights[t, j] times expert topk_ids[t, j]'s
    output for token t (fused_experts_ref, one expert at a time), in hidden_states' dtype; the
    inputs are left as they were."""
    x, w13, w2, weights, ids = case.tensors()
    given_ = [t.clone() for t in (x, w13, w2, weights, ids)]
    out = returned("fused_experts returned", impl.fused_experts(x, w13, w2, weights, ids))
    for name, now, was in zip(
        ("hidden_states", "w13_weight", "w2_weight", "topk_weights", "topk_ids"),
        (x, w13, w2, weights, ids),
        given_,
    ):
        assert torch.equal(now, was), f"fused_experts modified the {name} it was given"
    n, h = x.shape
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (n, h) and out.dtype == x.dtype, (
        f"the output should be a {x.dtype} tensor of shape {(n, h)} (num_tokens, hidden); got "
        f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
    )
    want = fused_experts_ref(x, w13, w2, weights, ids)
    atol, rtol = (1e-5, 1e-4) if x.dtype == torch.float32 else (0.1, 0.05)
    t = _first_bad_row(out, want, atol, rtol)
    if t is not None:
        experts = ids[t].tolist()
        alone = [
            [round(v, 4) for v in _expert_f64(x[t : t + 1], w13[e], w2[e])[0].tolist()]
            for e in experts
        ]
        raise AssertionError(
            f"token {t} goes to experts {experts} with weights "
            f"{[round(w, 4) for w in weights[t].tolist()]} (each expert alone gives {alone}), so "
            f"its row is {[round(v, 4) for v in want[t].tolist()]}; got "
            f"{[round(v, 4) for v in out[t].float().tolist()]}"
        )


@lesson_settings(30)
@example(case=RouterCase(4, 4, 2, True, "float32", 1.0, 7), hidden=4, intermediate=2)
@example(case=RouterCase(3, 6, 2, False, "float32", 4.0, 2), hidden=3, intermediate=3)
@given(
    case=router_cases().filter(lambda c: c.dtype == "float32"),
    hidden=st.integers(1, 5),
    intermediate=st.integers(1, 4),
)
@show_inputs
def test_the_layer_from_the_routers_logits_is_the_models(impl, case, hidden, intermediate):
    """From router logits to the layer's output (select_experts, then fused_experts): every
    expert run on every token, in float64, weighted by the rule's own choice of experts and
    weights."""
    gen = torch.Generator().manual_seed(case.seed + 1)
    e = case.num_experts
    x = torch.randn(case.num_tokens, hidden, generator=gen)
    w13 = torch.randn(e, 2 * intermediate, hidden, generator=gen) * 0.5
    w2 = torch.randn(e, hidden, intermediate, generator=gen) * 0.5
    logits = case.logits()
    weights, ids = impl.select_experts(logits, case.top_k, case.renormalize)
    out = returned("fused_experts returned", impl.fused_experts(x, w13, w2, weights, ids))
    want_weights, want_ids = _router_oracle(logits, case.top_k, case.renormalize)
    every = torch.stack([_expert_f64(x, w13[j], w2[j]) for j in range(e)], dim=1)  # [n, E, H]
    want = torch.stack(
        [
            sum(w * every[t, j] for w, j in zip(want_weights[t], want_ids[t]))
            for t in range(case.num_tokens)
        ]
    )
    t = _first_bad_row(out, want, 1e-5, 1e-4)
    assert t is None, (
        f"token {t}: the router gives it experts {want_ids[t]} with weights "
        f"{[round(w, 4) for w in want_weights[t]]}, so its row is "
        f"{[round(v, 4) for v in want[t].tolist()]}; got {[round(v, 4) for v in out[t].tolist()]}"
    )
