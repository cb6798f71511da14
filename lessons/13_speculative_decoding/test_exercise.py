"""Lesson 13 properties: greedy verification is plain greedy, rejection sampling keeps the target
model's distribution, and both emit the accepted proposals and then exactly one more token.

The distribution property is statistical: 2,000 verifications per example, and a tolerance of
3 / sqrt(n) on every token's frequency among the n verifications that reached a position. A
frequency's standard deviation is at most 0.5 / sqrt(n), so the tolerance is six of them: a
correct rule exceeds it with probability about 2e-9 per token checked. Measured on the engine's
rule: no failure in 10,000 fresh examples (21,159 positions judged; the largest deviation seen
was 0.78 of the tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.lessons.strategies import seeds
from nanovllm.lessons.testing import lesson_settings, show_inputs

TRIALS = 2000  # verifications per example of the distribution property
MIN_REACHED = 200  # a position reached fewer times than this is not judged
TOLERANCE = 3.0  # allowed |frequency - p| is TOLERANCE / sqrt(times reached): six sigmas


# --- greedy ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GreedyCase:
    """`greedy`: the s + 1 tokens plain greedy decoding would emit next. `draft_token_ids`: the
    s proposals, some of them right. `target_argmax`: what one forward pass over the proposals
    gives at each position: greedy's token while the proposals before it are right, anything
    after the first wrong one (the model then reads a prefix greedy never wrote)."""

    greedy: list[int]
    draft_token_ids: list[int]
    target_argmax: list[int]


@st.composite
def greedy_cases(draw) -> GreedyCase:
    vocab = draw(st.integers(2, 8))
    s = draw(st.integers(0, 6))
    token = st.integers(0, vocab - 1)
    greedy = draw(st.lists(token, min_size=s + 1, max_size=s + 1))
    draft = []
    for i in range(s):
        right = draw(st.sampled_from([True, True, True, False]))
        draft.append(greedy[i] if right else (greedy[i] + draw(st.integers(1, vocab - 1))) % vocab)
    target = [greedy[i] if draft[:i] == greedy[:i] else draw(token) for i in range(s + 1)]
    return GreedyCase(greedy, draft, target)


def _num_right(case: GreedyCase) -> int:
    a = 0
    while a < len(case.draft_token_ids) and case.draft_token_ids[a] == case.greedy[a]:
        a += 1
    return a


@lesson_settings(60)
@given(case=greedy_cases())
@show_inputs
def test_greedy_emits_exactly_what_plain_greedy_would(impl, case):
    """Greedy verification emits the first a + 1 tokens of plain greedy decoding, where a is how
    many proposals are right from the first on: the right proposals, then the correction (or,
    when all s are right, the bonus)."""
    emitted = [
        int(t) for t in impl.verify_greedy(list(case.target_argmax), list(case.draft_token_ids))
    ]
    a = _num_right(case)
    assert emitted == case.greedy[: a + 1], (
        f"emitted {emitted}; plain greedy emits {case.greedy[: a + 1]} (the first {a} "
        f"proposals are right, then {'the bonus' if a == len(case.draft_token_ids) else 'the correction'})"
    )


# --- rejection sampling ------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingCase:
    """A verification step: the target's distributions p_1 .. p_{s+1} (`target_probs`, one row
    each), the proposals, the draft model's distributions q_1 .. q_s (`draft_probs`; None for an
    n-gram proposer, certain of its tokens), and the seed of the generator handed over."""

    target_probs: torch.Tensor  # [s + 1, vocab]
    draft_token_ids: list[int]
    draft_probs: torch.Tensor | None  # [s, vocab]
    seed: int


def _distribution(gen: torch.Generator, vocab: int) -> torch.Tensor:
    """A random distribution over `vocab` tokens, often with some at probability 0."""
    weights = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 2
    if float(torch.rand(1, generator=gen)) < 0.5:
        weights = weights * (torch.rand(vocab, generator=gen) < 0.6)
        weights[int(torch.randint(vocab, (1,), generator=gen))] += 0.1  # never all zero
    return (weights / weights.sum()).float()


@st.composite
def sampling_cases(draw, max_s: int = 4, max_vocab: int = 6) -> SamplingCase:
    vocab = draw(st.integers(2, max_vocab))
    s = draw(st.integers(0, max_s))
    seed = draw(seeds)
    draft_model = draw(st.booleans())
    gen = torch.Generator().manual_seed(seed)
    target = torch.stack([_distribution(gen, vocab) for _ in range(s + 1)])
    if draft_model and s:
        draft_probs = torch.stack([_distribution(gen, vocab) for _ in range(s)])
        proposals = [int(torch.multinomial(draft_probs[i], 1, generator=gen)) for i in range(s)]
    else:
        draft_probs = None
        # An n-gram proposal: often a token the target likes, sometimes one it rules out.
        proposals = [
            int(torch.multinomial(target[i], 1, generator=gen))
            if float(torch.rand(1, generator=gen)) < 0.7
            else int(torch.randint(vocab, (1,), generator=gen))
            for i in range(s)
        ]
    return SamplingCase(target, proposals, draft_probs, seed)


def _verify(impl, case: SamplingCase, generator: torch.Generator, draft: list[int] | None = None):
    return impl.verify_random(
        case.target_probs,
        list(case.draft_token_ids if draft is None else draft),
        generator,
        case.draft_probs,
    )


@lesson_settings(40)
@given(case=sampling_cases(), repeats=st.integers(1, 4))
# p = 0.2 >= q = 0.1 at the proposal: min(1, p/q) = 1 accepts it every time. A rule that ignores
# q (accept when u < p) rejects it 4 times in 5, so 4 tries name that fault on every seed.
@example(
    case=SamplingCase(torch.tensor([[0.2, 0.8], [0.5, 0.5]]), [0], torch.tensor([[0.1, 0.9]]), 0),
    repeats=4,
)
# p = q = 0 at the proposal: the target rules it out, so it is rejected (min(1, p/q) with p = 0),
# and the residual max(0, p - q) is 0 everywhere: the token comes from p itself, never token 0.
@example(
    case=SamplingCase(
        torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.25, 0.75]]), [0], torch.tensor([[0.0, 0.5, 0.5]]), 0
    ),
    repeats=4,
)
@show_inputs
def test_random_emits_accepted_proposals_then_one_token(impl, case, repeats):
    """Rejection sampling emits between 1 and s + 1 tokens: accepted proposals, then one more,
    never a token the target gives probability 0, and never a rejected proposal in its own
    place."""
    generator = torch.Generator().manual_seed(case.seed)
    s, p = len(case.draft_token_ids), case.target_probs
    for _ in range(repeats):
        emitted = [int(t) for t in _verify(impl, case, generator)]
        assert 1 <= len(emitted) <= s + 1, (
            f"emitted {emitted}: 1 to {s + 1} tokens, not {len(emitted)}"
        )
        n = len(emitted)
        assert emitted[:-1] == case.draft_token_ids[: n - 1], (
            f"emitted {emitted}: all but the last must be the first {n - 1} proposals, accepted"
        )
        for i, token in enumerate(emitted):
            assert 0 <= token < p.shape[1], f"emitted {emitted}: token {token} is not in the vocab"
            assert p[i, token] > 0, (
                f"emitted {emitted}: token {token} at position {i} has target probability 0 there"
            )
        if n <= s:  # the proposal at position n - 1 was rejected
            i, x = n - 1, case.draft_token_ids[n - 1]
            # q: the draft's probabilities; an n-gram proposal is certain, q = 1 on it.
            p_x = float(p[i, x])
            q_x = 1.0 if case.draft_probs is None else float(case.draft_probs[i, x])
            assert p_x < q_x or p_x == 0, (
                f"emitted {emitted}: proposal {x} at position {i} was rejected, but there "
                f"p = {p_x:.4g} >= q = {q_x:.4g}: a proposal is accepted with probability "
                "min(1, p/q), here 1. The fault is in your acceptance test: does it use q?"
            )
            assert emitted[-1] != x, (
                f"emitted {emitted}: proposal {x} at position {i} was rejected, yet it was "
                f"emitted in its own place: draw from the residual max(0, p - q), which is 0 "
                f"there (p = {p_x:.4g}, q = {q_x:.4g})"
            )


@lesson_settings(12)
@given(case=sampling_cases(max_s=3, max_vocab=5))
# One likely token among many unlikely ones: a draw not in proportion to the weights (an
# exponential race that multiplies by the noise instead of dividing) favours the likely one.
@example(case=SamplingCase(torch.tensor([[0.3] + [0.1] * 7]), [], None, 0))
@show_inputs
def test_every_emitted_token_is_distributed_as_the_target(impl, case):
    """Over 2,000 verifications, the token emitted at each position has the target's
    distribution there: the first is distributed as p_1 whatever was proposed, the second as p_2
    when x_1 was accepted, and so on (tolerance: six standard deviations)."""
    p = case.target_probs
    s, vocab = len(case.draft_token_ids), p.shape[1]
    generator = torch.Generator().manual_seed(case.seed)
    if case.draft_probs is not None and s:
        # A draft model draws new proposals every time: x_i ~ q_i.
        redraw = torch.Generator().manual_seed(case.seed + 1)
        drafts = torch.multinomial(case.draft_probs, TRIALS, replacement=True, generator=redraw)
        drafts = drafts.T.tolist()  # [TRIALS, s]
    else:
        drafts = [case.draft_token_ids] * TRIALS
    counts = torch.zeros(s + 1, vocab, dtype=torch.float64)
    for draft in drafts:
        emitted = _verify(impl, case, generator, draft)
        for i, token in enumerate(emitted[: s + 1]):
            assert 0 <= int(token) < vocab, f"emitted {list(emitted)}: {token} is not in the vocab"
            counts[i, int(token)] += 1
    for i in range(s + 1):
        reached = float(counts[i].sum())
        if reached < MIN_REACHED:
            continue
        freq = counts[i] / reached
        gap = (freq - p[i].double()).abs()
        worst = int(gap.argmax())
        assert gap[worst] <= TOLERANCE / math.sqrt(reached), (
            f"position {i}: token {worst} came out {freq[worst]:.3f} of {reached:.0f} times "
            f"(the target's probability: {float(p[i, worst]):.3f}); frequencies "
            f"{[round(f, 3) for f in freq.tolist()]}, target {[round(f, 3) for f in p[i].tolist()]}"
        )


@lesson_settings(30)
@given(case=sampling_cases())
@show_inputs
def test_certain_targets_make_rejection_sampling_greedy(impl, case):
    """When every target distribution is certain (probability 1 on one token), rejection
    sampling emits exactly what greedy verification does."""
    p = case.target_probs
    certain = torch.zeros_like(p).scatter(1, p.argmax(dim=1, keepdim=True), 1.0)
    argmax = certain.argmax(dim=1).tolist()
    one_hot = SamplingCase(certain, case.draft_token_ids, case.draft_probs, case.seed)
    emitted = [int(t) for t in _verify(impl, one_hot, torch.Generator().manual_seed(case.seed))]
    a = 0
    while a < len(argmax) - 1 and case.draft_token_ids[a] == argmax[a]:
        a += 1
    expected = argmax[: a + 1]  # the proposals equal to the argmax, then the next argmax
    assert emitted == expected, (
        f"targets certain of {argmax}: emitted {emitted}, greedy verification emits {expected}"
    )


@lesson_settings(30)
@given(case=sampling_cases(), global_seeds=st.tuples(seeds, seeds))
@show_inputs
def test_random_draws_only_from_its_generator(impl, case, global_seeds):
    """The same generator seed gives the same tokens, whatever torch's global random state: a
    seeded request is reproducible."""
    runs = []
    with torch.random.fork_rng():  # the global state is put back afterwards
        for global_seed in global_seeds:
            torch.manual_seed(global_seed)
            generator = torch.Generator().manual_seed(case.seed)
            runs.append([[int(t) for t in _verify(impl, case, generator)] for _ in range(8)])
    assert runs[0] == runs[1], (
        f"the same generator seed gave {runs[0]} and then {runs[1]}: draw only from `generator`"
    )


@lesson_settings(30)
@given(greedy=greedy_cases(), sampling=sampling_cases())
@show_inputs
def test_neither_rule_modifies_its_inputs(impl, greedy, sampling):
    """Both rules leave their arguments as they were (the engine reads the proposals again after
    verifying them, for its acceptance statistics and events)."""
    argmax, draft = list(greedy.target_argmax), list(greedy.draft_token_ids)
    impl.verify_greedy(argmax, draft)
    assert argmax == greedy.target_argmax and draft == greedy.draft_token_ids, (
        "verify_greedy changed its arguments"
    )
    p = sampling.target_probs.clone()
    q = None if sampling.draft_probs is None else sampling.draft_probs.clone()
    proposals = list(sampling.draft_token_ids)
    impl.verify_random(p, proposals, torch.Generator().manual_seed(sampling.seed), q)
    assert torch.equal(p, sampling.target_probs), "verify_random changed target_probs"
    assert q is None or torch.equal(q, sampling.draft_probs), "verify_random changed draft_probs"
    assert proposals == sampling.draft_token_ids, "verify_random changed draft_token_ids"
