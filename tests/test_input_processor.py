"""The input processor on its own: what `add_request` accepts, what it refuses, and why.

Oracles: every refusal is a ValueError naming the bad value, with a `RequestRejected` event
saying the same, and nothing counted as arrived; a request fits the KV cache exactly when its
prompt and all its output but the last token (which is sampled, never computed), plus the draft
model's lookahead slots, fit the cache's slots; n > 1 fans out into n children with vLLM's ids
and the parent's seed + i.
"""

from __future__ import annotations

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.engine.input_processor import InputProcessor
from nanovllm.events import EventBus, RequestRejected
from nanovllm.sampling_params import SamplingParams

VOCAB = 100


class WordTokenizer:
    """One token per character: enough to tokenize a prompt given as text."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % VOCAB for c in text]


def processor(known: set[str] = frozenset(), seed: int = 0, **sizes) -> InputProcessor:
    options = dict(max_model_len=32, num_kv_blocks=16, block_size=4, num_lookahead_tokens=0)
    options.update(sizes)
    return InputProcessor(
        WordTokenizer(), vocab_size=VOCAB, eos_token_ids=frozenset({2}), seed=seed,
        events=EventBus(), is_known=known.__contains__, **options,
    )  # fmt: skip


GREEDY = SamplingParams(temperature=0)
BAD = [
    ("empty prompt", "", GREEDY, "is empty"),
    ("empty token list", [], GREEDY, r"prompt \[\] is empty"),
    ("token outside the vocabulary", [1, VOCAB], GREEDY, rf"token id {VOCAB} is outside"),
    ("negative token", [1, -1], GREEDY, r"token id -1 is outside"),
    ("token that is no int", [1, "a"], GREEDY, r"token id 'a' is outside"),
    ("prompt as long as max_model_len", [1] * 32, GREEDY, "max_model_len=32"),
    ("too many logprobs", [1], SamplingParams(logprobs=VOCAB + 1), f"logprobs={VOCAB + 1}"),
    ("params of the wrong type", [1], {"temperature": 0}, "must be a SamplingParams, got dict"),
    ("prompt of the wrong type", 3.5, GREEDY, "got float"),
    ("dict without a prompt", {"text": "a"}, GREEDY, r"got keys \['text'\]"),
    ("longer than the KV cache", [1] * 30, SamplingParams(max_tokens=2), "more than the whole"),
    (
        "stop token outside the vocabulary",
        [1],
        SamplingParams(stop_token_ids=[2, VOCAB]),
        rf"stop_token_ids token id\(s\) \[{VOCAB}\] are outside",
    ),
    (
        "many ids outside, a few named",
        [1],
        SamplingParams(allowed_token_ids=list(range(10**5))),
        rf"\[{VOCAB}, {VOCAB + 1}, {VOCAB + 2}, {VOCAB + 3}, {VOCAB + 4}, \.\.\. \([0-9,]+ more\)\]",
    ),
]


@pytest.mark.parametrize(
    ("prompt", "params", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_a_bad_request_is_refused_by_name(prompt, params, match) -> None:
    inputs = processor(num_kv_blocks=7)  # 28 slots
    seen = []
    inputs.events.subscribe(seen.append)
    with pytest.raises(ValueError, match=match) as refused:
        inputs.process_inputs("r", prompt, params)
    assert seen == [RequestRejected("r", str(refused.value))]
    assert inputs.num_arrivals == 0


def test_an_id_in_use_is_refused_for_the_request_and_for_its_children() -> None:
    with pytest.raises(ValueError, match="'r' is already in the engine"):
        processor({"r"}).process_inputs("r", [1], GREEDY)
    with pytest.raises(ValueError, match="'1_r' is already in the engine"):
        processor({"1_r"}).process_inputs("r", [1], SamplingParams(n=2))


@settings(max_examples=examples(100), deadline=None)
@given(
    num_prompt=st.integers(1, 40),
    max_tokens=st.integers(1, 40),
    num_blocks=st.integers(1, 12),
    lookahead=st.integers(0, 4),
)
def test_a_request_fits_the_kv_cache_exactly_when_its_slots_do(
    num_prompt, max_tokens, num_blocks, lookahead
) -> None:
    inputs = processor(max_model_len=128, num_kv_blocks=num_blocks, num_lookahead_tokens=lookahead)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    fits = num_prompt + max_tokens - 1 + lookahead <= num_blocks * 4
    try:
        (request,), _ = inputs.process_inputs("r", [1] * num_prompt, params)
    except ValueError as exc:
        assert not fits and "more than the whole KV cache" in str(exc)
    else:
        assert fits and request.max_tokens == max_tokens


@pytest.mark.parametrize("max_tokens", [None, 13, 10**12])
def test_max_tokens_is_capped_by_max_model_len(max_tokens) -> None:
    """Offline, as in vLLM's engine (its scheduler stops a request at max_model_len): the rest
    of the context, never an error. (The server refuses such a max_tokens: serving.py.)"""
    params = SamplingParams(max_tokens=max_tokens)
    (request,), _ = processor().process_inputs("r", [1] * 20, params)
    assert request.max_tokens == 32 - 20


@settings(max_examples=examples(30), deadline=None)
@given(n=st.integers(2, 5), seed=st.none() | st.integers(0, 2**63 - 1))
def test_n_fans_out_into_children_with_vllms_ids_and_seeds(n, seed) -> None:
    inputs = processor()
    params = SamplingParams(n=n, seed=seed, temperature=0.8)
    children, parent = inputs.process_inputs("p", "hello", params)
    assert parent is not None and parent.children == children
    assert [c.request_id for c in children] == [f"{i}_p" for i in range(n)]
    assert [(c.parent_id, c.index) for c in children] == [("p", i) for i in range(n)]
    assert all(c.prompt_token_ids == WordTokenizer().encode("hello") for c in children)
    assert all(c.sampling_params.n == 1 for c in children)
    if seed is not None:
        assert [c.seed for c in children] == [(seed + i) % 2**63 for i in range(n)]
    assert [c.arrival_index for c in children] == list(range(1, n + 1))


def test_unseeded_sampled_requests_get_seeds_from_the_engine_seed() -> None:
    def seeds(engine_seed: int) -> list[int | None]:
        inputs = processor(seed=engine_seed)
        params = [SamplingParams(temperature=0.8), GREEDY, SamplingParams(temperature=1, seed=7)]
        return [inputs.process_inputs(f"r{i}", [1], p)[0][0].seed for i, p in enumerate(params)]

    first = seeds(0)
    assert first[1:] == [None, 7], "a greedy request needs no seed; a seeded one keeps its own"
    assert first == seeds(0) and first[0] != seeds(1)[0]


def test_prompts_are_text_token_ids_or_a_dict_of_either() -> None:
    inputs = processor()
    assert inputs.tokenize("ab") == ("ab", WordTokenizer().encode("ab"))
    assert inputs.tokenize([3, 4]) == (None, [3, 4])
    assert inputs.tokenize({"prompt_token_ids": (3, 4), "prompt": "x"}) == ("x", [3, 4])
    assert inputs.tokenize({"prompt": "ab"}) == inputs.tokenize("ab")


@pytest.mark.parametrize(
    "key", ["05", " 5", "5 ", "+5", "5_0", "\u0665", "\uff15", "", -1, True, 5.0]
)
def test_a_logit_bias_key_is_a_token_id_written_one_way(key) -> None:
    """int() reads "05", " 5" and "\u0665" (an Arabic-Indic five) as 5: several keys for one
    token. Only an int or its canonical decimal digits name a token."""
    with pytest.raises(ValueError, match="logit_bias key"):
        SamplingParams(logit_bias={key: 1.0})
    assert SamplingParams(logit_bias={"5": 1.0, 6: -1.0, "0": 2.0}).logit_bias == {
        5: 1.0, 6: -1.0, 0: 2.0
    }  # fmt: skip
