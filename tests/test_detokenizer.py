"""Incremental detokenization seeded with the prompt, for byte-level BPE and SentencePiece-style
(Metaspace) tokenizers.

Oracle: the streamed text of an output always equals `decode(prompt + output)` minus
`decode(prompt)`: what the text of the whole sequence gained by the output. A Metaspace tokenizer
drops the leading space of the first token it decodes, so a detokenizer that starts its window at
the first output token streams "world" where the sequence gained " world".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from budget import examples
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tiny_models import make_model, make_tokenizer_files

from nanovllm import LLM, SamplingParams
from nanovllm.engine.detokenizer import DetokenizerState, IncrementalDetokenizer, rust_decoder


@pytest.fixture(scope="module", params=["bytelevel", "metaspace"])
def tokenizer(request, tmp_path_factory):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp(request.param)
    make_tokenizer_files(path, request.param)
    return AutoTokenizer.from_pretrained(str(path))


def stream(tokenizer, prompt_ids: list[int], output_ids: list[int], skip: bool) -> str:
    """What the engine streams: one token at a time, then the final flush."""
    detok = IncrementalDetokenizer(tokenizer)
    state = DetokenizerState.after_prompt(prompt_ids, skip_special_tokens=skip)
    ids = list(prompt_ids)
    for token in output_ids:
        ids.append(token)
        detok.step(state, ids)
    detok.step(state, ids, final=True)
    return state.text


@pytest.mark.quick
@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_streamed_text_is_what_the_output_adds(tokenizer, data, skip) -> None:
    vocab = len(tokenizer)
    ids = st.integers(0, vocab - 1)
    prompt_ids = data.draw(st.lists(ids, min_size=1, max_size=12), label="prompt_ids")
    output_ids = data.draw(st.lists(ids, min_size=1, max_size=12), label="output_ids")
    prompt_text = tokenizer.decode(prompt_ids, skip_special_tokens=skip)
    full_text = tokenizer.decode(prompt_ids + output_ids, skip_special_tokens=skip)
    # A prompt ending inside a multi-byte character decodes to U+FFFD, which the full text
    # replaces by the real character: then "what the output adds" is not a suffix.
    assume(full_text.startswith(prompt_text))
    assert stream(tokenizer, prompt_ids, output_ids, skip) == full_text[len(prompt_text) :]


@settings(max_examples=examples(40), deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_the_rust_decode_is_transformers_decode(tokenizer, data, skip) -> None:
    # The detokenizer calls the Rust tokenizer directly where that changes nothing.
    decode = rust_decoder(tokenizer)
    assert decode is not None
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=16), label="ids")
    assert decode(ids, skip) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_a_tokenizer_that_cleans_up_spaces_keeps_transformers_decode(tokenizer) -> None:
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert rust_decoder(tokenizer) is None
    finally:
        tokenizer.clean_up_tokenization_spaces = False


@pytest.fixture(scope="module")
def metaspace_model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("metaspace_model"), tokenizer="metaspace")


def test_the_engine_keeps_the_first_tokens_leading_space(metaspace_model) -> None:
    """The model is made to answer with a word-initial token ("▁Romeo"), whose leading space a
    Metaspace tokenizer drops when it decodes that token first."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(metaspace_model))
    word = tok.convert_tokens_to_ids("\u2581Romeo")
    assert word != tok.unk_token_id
    llm = LLM(str(metaspace_model), block_size=4)
    model = llm.llm_engine.runner.model
    real = model.compute_logits

    def answers_romeo(hidden):
        logits = real(hidden)
        logits[:, word] = logits.max() + 10.0
        return logits

    model.compute_logits = answers_romeo
    prompts = ["ROMEO:", "O Romeo", "But soft"]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs:
        assert out.outputs[0].token_ids == [word] * 3
        prompt_text = tok.decode(out.prompt_token_ids, skip_special_tokens=True)
        full = tok.decode(out.prompt_token_ids + out.outputs[0].token_ids, skip_special_tokens=True)
        assert out.outputs[0].text == full[len(prompt_text) :] == " Romeo Romeo Romeo"
