"""The output processor on its own: tokens in, text, stops and `RequestOutput`s out, no model.

Oracles:
- the three output kinds are views of one completion: the DELTA outputs of a request add up to
  its last CUMULATIVE output, and FINAL_ONLY gives that one output alone;
- stops are checked token by token, so a step that brings several tokens (speculative decoding)
  ends a request exactly where one token per step would;
- fan-in: a parent's output holds each child's completion as that child alone would produce it,
  one output per parent and step, and the parent is forgotten once every child is done.
"""

from __future__ import annotations

import dataclasses

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import make_tokenizer_files

from nanovllm.engine.input_processor import InputProcessor
from nanovllm.engine.output_processor import OutputProcessor
from nanovllm.engine.outputs import RequestOutput
from nanovllm.events import EventBus, TokenEmitted
from nanovllm.request import FinishReason, Request, RequestStatus
from nanovllm.sampling_params import RequestOutputKind, SamplingParams

CUMULATIVE, DELTA, FINAL_ONLY = (
    RequestOutputKind.CUMULATIVE,
    RequestOutputKind.DELTA,
    RequestOutputKind.FINAL_ONLY,
)
PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("bytelevel")
    make_tokenizer_files(path, "bytelevel")
    return AutoTokenizer.from_pretrained(str(path))


def finish(request: Request, reason: FinishReason) -> None:
    """The scheduler's part of ending a request, without blocks."""
    request.status = RequestStatus.FINISHED
    request.finish_reason = reason


def make_request(params: SamplingParams, max_tokens: int, request_id: str = "r") -> Request:
    return Request(request_id, list(PROMPT), params, 0, max_tokens=max_tokens)


def feed(
    processor: OutputProcessor, requests: list[Request], tokens: list[int], chunks: list[int]
) -> list[RequestOutput]:
    """Give every request the same `tokens`, `chunks[i]` of them in step i (fewer once they run
    out), until they finish; every output of every step, in order."""
    outputs: list[RequestOutput] = []
    done = 0
    for step, size in enumerate(chunks):
        chunk = tokens[done : done + size]
        done += size
        updated = []
        for request in requests:
            if not request.is_finished and chunk:
                for token in chunk:
                    request.append_output_token(token)
                updated.append((request, len(chunk)))
        progress = processor.process_new_tokens(step, updated, {}, finish)
        outputs += processor.make_request_outputs(progress)
    return outputs


@st.composite
def streams(draw):
    """(tokens, chunk sizes that cover them, sampling params): a stop string cut from the
    tokens' own text half the time, so that it is found."""
    tokens = draw(st.lists(st.integers(0, 255), min_size=1, max_size=16), label="tokens")
    chunks = draw(st.lists(st.integers(1, 4), min_size=len(tokens), max_size=len(tokens)))
    stop_token_ids = draw(st.lists(st.integers(0, 255), max_size=1), label="stop_token_ids")
    return tokens, chunks, stop_token_ids, draw(st.data())


def params_for(tokenizer, tokens, stop_token_ids, data, kind) -> SamplingParams:
    text = tokenizer.decode(tokens)
    stop = []
    if text and data.draw(st.booleans(), label="a stop string from the text"):
        start = data.draw(st.integers(0, len(text) - 1), label="stop start")
        stop = [text[start : start + data.draw(st.integers(1, 3), label="stop length")]]
    include = data.draw(st.booleans(), label="include_stop_str_in_output")
    return SamplingParams(
        temperature=0,
        ignore_eos=True,
        stop=stop,
        stop_token_ids=stop_token_ids,
        include_stop_str_in_output=include,
        output_kind=kind,
    )


@settings(max_examples=examples(60), deadline=None)
@given(stream=streams())
def test_delta_and_final_only_are_views_of_the_cumulative_output(tokenizer, stream) -> None:
    tokens, chunks, stop_token_ids, data = stream
    params = params_for(tokenizer, tokens, stop_token_ids, data, CUMULATIVE)
    final = {}
    for kind in (CUMULATIVE, DELTA, FINAL_ONLY):
        request = make_request(dataclasses.replace(params, output_kind=kind), len(tokens))
        processor = OutputProcessor(tokenizer, EventBus())
        processor.add_request(request)
        final[kind] = feed(processor, [request], tokens, chunks)
        assert request.is_finished and final[kind][-1].finished
        assert not processor.has_unfinished_requests(), "a finished request is forgotten"
    last = final[CUMULATIVE][-1].outputs[0]
    deltas = [o.outputs[0] for o in final[DELTA]]
    assert "".join(c.text for c in deltas) == last.text
    assert [t for c in deltas for t in c.token_ids] == last.token_ids
    assert len(final[FINAL_ONLY]) == 1 and final[FINAL_ONLY][0].outputs[0] == last
    assert [o.delta_text for o in final[CUMULATIVE]] == [c.text for c in deltas]


@settings(max_examples=examples(60), deadline=None)
@given(stream=streams())
def test_several_tokens_in_a_step_stop_where_one_at_a_time_would(tokenizer, stream) -> None:
    tokens, chunks, stop_token_ids, data = stream
    params = params_for(tokenizer, tokens, stop_token_ids, data, CUMULATIVE)
    ends = []
    for sizes in (chunks, [1] * len(tokens)):
        request = make_request(params, len(tokens))
        processor = OutputProcessor(tokenizer, EventBus())
        processor.add_request(request)
        last = feed(processor, [request], tokens, sizes)[-1].outputs[0]
        ends.append((last.text, last.token_ids, last.finish_reason, last.stop_reason))
        assert request.output_token_ids == last.token_ids, "tokens after the stop are dropped"
    assert ends[0] == ends[1]


def test_every_token_checked_is_an_event_with_its_text(tokenizer) -> None:
    events = EventBus()
    seen = []
    events.subscribe(seen.append)
    tokens = tokenizer.encode("a cab, abc")
    request = make_request(SamplingParams(temperature=0, ignore_eos=True), len(tokens))
    processor = OutputProcessor(tokenizer, events)
    processor.add_request(request)
    (output,) = feed(processor, [request], tokens, [len(tokens)])
    emitted = [e for e in seen if isinstance(e, TokenEmitted)]
    assert [e.token_id for e in emitted] == output.outputs[0].token_ids == tokens
    assert [e.num_output_tokens for e in emitted] == list(range(1, len(tokens) + 1))
    assert "".join(e.text_delta for e in emitted) == output.outputs[0].text


@settings(max_examples=examples(30), deadline=None)
@given(
    n=st.integers(2, 4),
    kind=st.sampled_from([CUMULATIVE, DELTA, FINAL_ONLY]),
    data=st.data(),
)
def test_a_parent_gathers_its_childrens_completions(tokenizer, n, kind, data) -> None:
    inputs = InputProcessor(
        tokenizer, vocab_size=256, max_model_len=64, num_kv_blocks=64, block_size=4,
        num_lookahead_tokens=0, eos_token_ids=frozenset(), seed=0, events=EventBus(),
        is_known=lambda request_id: False,
    )  # fmt: skip
    params = SamplingParams(temperature=0, ignore_eos=True, n=n, max_tokens=6, output_kind=kind)
    children, parent = inputs.process_inputs("p", list(PROMPT), params)
    processor = OutputProcessor(tokenizer, EventBus())
    for child in children:
        processor.add_request(child, parent)
    assert list(processor.parent_requests) == ["p"]
    streams = [data.draw(st.lists(st.integers(0, 255), min_size=6, max_size=6)) for _ in children]
    outputs: list[RequestOutput] = []
    step = 0
    while not all(c.is_finished for c in children):
        unfinished = [i for i, child in enumerate(children) if not child.is_finished]
        moving = data.draw(st.sets(st.sampled_from(unfinished), min_size=1), label="who moves")
        updated = []
        for i in sorted(moving):
            child = children[i]
            child.append_output_token(streams[i][child.num_output_tokens])
            updated.append((child, 1))
        step += 1
        progress = processor.process_new_tokens(step, updated, {}, finish)
        new = processor.make_request_outputs(progress)
        assert [o.request_id for o in new] in ([], ["p"]), "one output per parent and step"
        if kind != FINAL_ONLY:
            assert new
        outputs += new
    assert outputs and outputs[-1].finished and outputs[-1].request_id == "p"
    assert not processor.parent_requests and not processor.has_unfinished_requests()
    if kind == FINAL_ONLY:
        assert len(outputs) == 1
    for i in range(n):
        # The oracle: the same child's tokens as a request of its own.
        alone = make_request(dataclasses.replace(params, n=1, output_kind=CUMULATIVE), 6)
        solo = OutputProcessor(tokenizer, EventBus())
        solo.add_request(alone)
        expected = feed(solo, [alone], streams[i], [1] * 6)[-1].outputs[0]
        if kind == DELTA:
            mine = [o.outputs[i] for o in outputs]
            text, token_ids = "".join(c.text for c in mine), [t for c in mine for t in c.token_ids]
        else:
            text, token_ids = outputs[-1].outputs[i].text, outputs[-1].outputs[i].token_ids
        assert (text, token_ids) == (expected.text, expected.token_ids)
        assert outputs[-1].outputs[i].index == i


def test_output_text_is_the_text_so_far(tokenizer) -> None:
    request = make_request(SamplingParams(temperature=0, ignore_eos=True), max_tokens=8)
    quiet = make_request(SamplingParams(temperature=0, detokenize=False), 8, request_id="q")
    processor = OutputProcessor(tokenizer, EventBus())
    processor.add_request(request)
    processor.add_request(quiet)
    assert processor.output_text("r") == ""
    tokens = tokenizer.encode("hello")
    outputs = feed(processor, [request, quiet], tokens, [1] * len(tokens))
    assert processor.output_text("r") == "".join(
        o.delta_text for o in outputs if o.request_id == "r"
    )
    assert processor.output_text("r")
    assert processor.output_text("q") == "" and processor.output_text("unknown") == ""
