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
    range (from confident to flat)."""
    rows = draw(st.integers(1, 3))
    vocab = draw(st.integers(1, 12))
    values = st.one_of(st.integers(-6, 6).map(float), st.floats(-30, 30, width=32))
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


def _stream(impl, token_ids: list[int]):
    tokenizer = ToyTokenizer()
    state = DetokenizerState()
    deltas = []
    for i in range(1, len(token_ids) + 1):
        deltas.append(impl.detokenize_step(tokenizer, state, token_ids[:i]))
    return tokenizer, state, deltas


@lesson_settings(40)
@given(token_ids=toy_token_ids)
@show_inputs
def test_streamed_pieces_add_up_to_the_text(impl, token_ids):
    """After every step, the text so far is the decoded text of the tokens so far (all of it,
    unless that ends in half a character, which is held back)."""
    tokenizer, state = ToyTokenizer(), DetokenizerState()
    streamed = ""
    for i in range(1, len(token_ids) + 1):
        delta = impl.detokenize_step(tokenizer, state, token_ids[:i])
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
