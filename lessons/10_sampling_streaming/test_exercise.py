"""Lesson 10 properties: top-k and top-p keep the right tokens; streamed text adds up."""

from __future__ import annotations

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.engine.detokenizer import DetokenizerState
from nanovllm.lessons.strategies import ToyTokenizer, toy_token_ids
from nanovllm.lessons.testing import lesson_settings, returned, show_inputs


@st.composite
def logit_rows(draw) -> torch.Tensor:
    """1-3 rows over a vocabulary of 1-12, with many ties (values from a small set) and a wide
    range (from flat to so confident that some probabilities are exactly 0 in float32)."""
    rows = draw(st.integers(1, 3))
    vocab = draw(st.integers(1, 12))
    values = st.one_of(
        st.integers(-6, 6).map(float),
        st.floats(-30, 30, width=32),
        st.floats(-300, 300, width=32),
    )
    data = draw(
        st.lists(st.lists(values, min_size=vocab, max_size=vocab), min_size=rows, max_size=rows)
    )
    return torch.tensor(data, dtype=torch.float32)


def _unchanged(logits: torch.Tensor, original: torch.Tensor, name: str) -> None:
    """The caller's logits are as they were before `name` ran (the input shown is the copy)."""
    if not torch.equal(logits, original):
        returned("logits after the call", logits)
        raise AssertionError(
            f"{name} changed the logits it was given (the input above is as it was before the "
            "call): the caller's tensor must stay as it is; return a new one (masked_fill, not "
            "masked_fill_)"
        )


def _kept(filtered: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    kept = torch.isfinite(filtered)
    assert filtered.shape == logits.shape, "the shape must not change"
    assert torch.equal(filtered[kept], logits[kept]), "kept logits must be unchanged"
    assert torch.all(filtered[~kept] == float("-inf")), "removed logits must be -inf"
    return kept


@lesson_settings(40)
@given(logits=logit_rows(), k=st.integers(1, 14))
@show_inputs
def test_top_k_keeps_the_k_largest_and_their_ties(impl, logits, k):
    """top-k keeps every logit >= the row's k-th largest (k of them, more when logits tie at the
    boundary, as in vLLM), unchanged, and sets the rest to -inf."""
    original = logits.clone()
    filtered = impl.apply_top_k(logits, k)
    _unchanged(logits, original, "apply_top_k")
    kept = _kept(filtered, logits)
    for row, mask in zip(logits, kept):
        kth = sorted(row.tolist(), reverse=True)[min(k, len(row)) - 1]
        expected = row >= kth
        assert torch.equal(mask, expected), (
            f"kept {int(mask.sum())} of {len(row)} tokens with k={k}; vLLM keeps every logit "
            f">= the k-th largest ({kth}): {int(expected.sum())} here"
        )


@lesson_settings(40)
@given(logits=logit_rows(), p=st.floats(0.01, 1.0))
# The most likely token (p 0.67) alone is not enough for p = 0.9: it is still kept, first.
@example(logits=torch.tensor([[1.0, 0.0, -1.0]]), p=0.9)
@show_inputs
def test_top_p_keeps_the_smallest_nucleus(impl, logits, p):
    """top-p keeps the smallest set of most likely tokens whose probability reaches p, the most
    likely always."""
    original = logits.clone()
    filtered = impl.apply_top_p(logits, p)
    _unchanged(logits, original, "apply_top_p")
    kept = _kept(filtered, logits)
    eps = 1e-5
    for row, mask in zip(logits, kept):
        probs = torch.softmax(row.double(), dim=-1)
        assert mask[row.argmax()], "the most likely token must always be kept"
        mass = float(probs[mask].sum())
        assert mass >= p - eps, f"kept tokens hold {mass:.4f} < p={p:.4f} of the probability"
        assert mass - float(probs[mask].min()) < p + eps, (
            f"not the smallest set: without its least likely token it still holds >= p={p:.4f}"
        )
        if (~mask).any():
            low = int(torch.where(mask, probs, torch.inf).argmin())
            high = int(torch.where(mask, -torch.inf, probs).argmax())
            assert probs[low] >= probs[high] - 1e-12, (
                f"token {high} (logit {float(row[high])!r}) was removed, but token {low} (logit "
                f"{float(row[low])!r}), which is less likely, was kept: the rule orders tokens by "
                "logit, highest first (probabilities can round equal where logits differ; "
                "sort the logits)"
            )


@lesson_settings(20)
@given(
    vocab=st.sampled_from([1, 2, 4, 8]),
    rows=st.integers(1, 3),
    level=st.floats(-50, 50, width=32),
    data=st.data(),
)
@show_inputs
def test_top_p_boundary_is_inclusive(impl, vocab, rows, level, data):
    """With all logits equal (each probability exactly 1/vocab, a power of two, so every sum is
    exact), p = j/vocab keeps exactly j tokens: a token is dropped when those ranked above it
    sum to p exactly, not only past it."""
    j = data.draw(st.integers(1, vocab), label="j")
    logits = torch.full((rows, vocab), level)
    kept = torch.isfinite(impl.apply_top_p(logits, j / vocab)).sum(dim=-1)
    assert kept.tolist() == [j] * rows, (
        f"p = {j}/{vocab} over {vocab} equally likely tokens kept {kept.tolist()} per row; "
        f"the first {j} already sum to p exactly: the rest are dropped"
    )


@lesson_settings(30)
@given(logits=logit_rows())
@show_inputs
def test_top_p_of_one_keeps_every_token(impl, logits):
    """p = 1 is top-p off: every token is kept, the least likely too (in float32 the running sum
    of a confident row reaches 1.0 before its last tokens)."""
    original = logits.clone()
    filtered = impl.apply_top_p(logits, 1.0)
    _unchanged(logits, original, "apply_top_p")
    assert torch.equal(filtered, logits), f"p = 1 removed tokens: {filtered.tolist()}"


def _stream(impl, token_ids: list[int]):
    tokenizer = ToyTokenizer()
    state = DetokenizerState()
    deltas = []
    for i in range(1, len(token_ids) + 1):
        deltas.append(impl.detokenize_step(tokenizer, state, token_ids[:i]))
    return tokenizer, state, deltas


def _offsets_after(state: DetokenizerState, token_ids: list[int]) -> tuple[int, int]:
    """The (prefix_offset, read_offset) one step should leave, from the rule in the exercise's
    docstring (not the engine's code: the check must not share a fault with what it checks)."""
    decode = ToyTokenizer().decode
    prefix_text = decode(token_ids[state.prefix_offset : state.read_offset])
    new_text = decode(token_ids[state.prefix_offset :])
    if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
        return state.prefix_offset, state.read_offset
    return state.read_offset, len(token_ids)


@lesson_settings(40)
@given(token_ids=toy_token_ids)
@show_inputs
def test_streamed_pieces_add_up_to_the_text(impl, token_ids):
    """After every step, the text so far is the decoded text of the tokens so far (all of it,
    unless that ends in half a character, which is held back)."""
    tokenizer, state = ToyTokenizer(), DetokenizerState()
    streamed = ""
    for i in range(1, len(token_ids) + 1):
        offsets = _offsets_after(state, token_ids[:i])
        delta = impl.detokenize_step(tokenizer, state, token_ids[:i])
        assert (state.prefix_offset, state.read_offset) == offsets, (
            f"after {token_ids[:i]}: offsets (prefix, read) = "
            f"({state.prefix_offset}, {state.read_offset}), expected {offsets}: a step that "
            'returns "" changes nothing; one that sends text moves prefix_offset to read_offset '
            "and read_offset to the end"
        )
        streamed += delta
        full = ToyTokenizer().decode(token_ids[:i])
        assert streamed == state.text, "the returned pieces must add up to state.text"
        assert full.startswith(streamed), f"streamed {streamed!r}, but the text is {full!r}"
        if not full.endswith("\ufffd"):
            assert streamed == full, f"streamed {streamed!r}; everything of {full!r} can be sent"


@lesson_settings(40)
@given(token_ids=toy_token_ids)
@show_inputs
def test_never_streams_half_a_character(impl, token_ids):
    """No streamed piece ends in half a character (U+FFFD)."""
    _, _, deltas = _stream(impl, token_ids)
    for delta in deltas:
        assert not delta.endswith("\ufffd"), f"streamed {delta!r}: half a character"


@lesson_settings(30)
@given(token_ids=st.lists(st.integers(0, 16), min_size=1, max_size=30))
@show_inputs
def test_decodes_only_a_short_window(impl, token_ids):
    """With whole characters only, each step decodes a few tokens, not the whole output."""
    tokenizer, _, _ = _stream(impl, token_ids)
    assert max(tokenizer.calls, default=0) <= 4, (
        f"a decode call got {max(tokenizer.calls)} tokens: decode a window, not everything"
    )
