"""What each step's outputs hold: `output_kind` (CUMULATIVE, DELTA, FINAL_ONLY) and `detokenize`.

The oracle is the default, `CUMULATIVE` with text: the same requests (seeded, so each draws the
same tokens in any batch) run once per kind, and
- `DELTA` outputs, added up per completion, equal the cumulative run's last output, step by step
  equal to the cumulative outputs' differences (text, token ids, logprobs);
- `FINAL_ONLY` gives exactly one output per request, finished, equal to that last output;
- `detokenize=False` gives the same token ids and no text.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm import LLM, LLMEngine, SamplingParams
from nanovllm.config import EngineConfig
from nanovllm.engine import output_processor
from nanovllm.engine.outputs import CompletionOutput, RequestOutput
from nanovllm.sampling_params import RequestOutputKind

CUMULATIVE, DELTA, FINAL_ONLY = (
    RequestOutputKind.CUMULATIVE,
    RequestOutputKind.DELTA,
    RequestOutputKind.FINAL_ONLY,
)
_ids = itertools.count()


@pytest.fixture(scope="module")
def engine(tiny_llama) -> LLMEngine:
    # A small KV cache (preemption) and budget (chunked prefills): outputs must not care. No
    # prefix caching, so that every run of the same requests takes the same steps (a run that
    # hit the cache would produce its outputs in fewer steps), and outputs compare one by one.
    config = EngineConfig(
        model=str(tiny_llama),
        block_size=4,
        num_kv_blocks=24,
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
    )
    return LLMEngine(config)


def run(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]], **changes):
    """Every output of every step, per request, for `requests` with `changes` to their params."""
    ids = [f"r{next(_ids)}" for _ in requests]
    for request_id, (prompt, params) in zip(ids, requests):
        engine.add_request(request_id, prompt, dataclasses.replace(params, **changes))
    outputs: dict[str, list[RequestOutput]] = {request_id: [] for request_id in ids}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id].append(output)
    assert engine.kv_cache_manager.num_used_blocks == 0
    return [outputs[request_id] for request_id in ids]


def same_completion(a: CompletionOutput, b: CompletionOutput) -> bool:
    keep = ("index", "text", "token_ids", "logprobs", "finish_reason", "stop_reason")
    return all(getattr(a, name) == getattr(b, name) for name in keep)


requests_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(3, 60), min_size=1, max_size=12),  # prompt token ids
        st.builds(
            SamplingParams,
            n=st.sampled_from([1, 1, 2]),
            temperature=st.sampled_from([0.0, 1.0]),
            seed=st.integers(0, 1000),
            max_tokens=st.integers(1, 12),
            ignore_eos=st.booleans(),
            logprobs=st.sampled_from([None, 0, 2]),
            stop_token_ids=st.lists(st.integers(3, 60), max_size=2),
        ),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=examples(15), deadline=None)
@given(requests=requests_strategy, stop_chars=st.integers(1, 2))
def test_delta_and_final_only_outputs_add_up_to_the_cumulative_ones(
    engine: LLMEngine, requests, stop_chars: int
) -> None:
    # A stop string some greedy request will meet (cut text, finish_reason "stop"), if it has text.
    probe = run(engine, requests[:1])[0][-1].outputs[0].text
    if len(probe) > stop_chars:
        prompt, params = requests[0]
        stop = probe[1 : 1 + stop_chars]
        requests = [(prompt, dataclasses.replace(params, stop=[stop]))] + requests[1:]

    cumulative = run(engine, requests)
    delta = run(engine, requests, output_kind=DELTA)
    final_only = run(engine, requests, output_kind=FINAL_ONLY)

    for (_, params), cum, dlt, fin in zip(requests, cumulative, delta, final_only):
        last = cum[-1]
        assert last.finished and len(last.outputs) == params.n
        # FINAL_ONLY: one output, the last one.
        assert len(fin) == 1 and fin[0].finished
        assert all(map(same_completion, fin[0].outputs, last.outputs))
        # DELTA: the same outputs, each holding only what its step added.
        assert len(dlt) == len(cum)
        for i in range(params.n):
            text, token_ids, logprobs = "", [], []
            for c_out, d_out in zip(cum, dlt):
                c, d = c_out.outputs[i], d_out.outputs[i]
                assert d.text == c.delta_text == d.delta_text
                assert d.token_ids == c.delta_token_ids == d.delta_token_ids
                text, token_ids = text + d.text, token_ids + d.token_ids
                if params.logprobs is not None:
                    assert len(d.logprobs) == len(d.token_ids)
                    logprobs += d.logprobs
                assert (d.finish_reason, d.stop_reason) == (c.finish_reason, c.stop_reason)
            assert (text, token_ids) == (last.outputs[i].text, last.outputs[i].token_ids)
            if params.logprobs is not None:
                assert logprobs == last.outputs[i].logprobs


@settings(max_examples=examples(10), deadline=None)
@given(requests=requests_strategy)
def test_detokenize_false_gives_the_same_tokens_and_no_text(engine: LLMEngine, requests) -> None:
    with_text = run(engine, requests)
    without = run(engine, requests, detokenize=False)
    for a, b in zip(with_text, without):
        assert len(a) == len(b)
        for a_out, b_out in zip(a, b):
            for ca, cb in zip(a_out.outputs, b_out.outputs, strict=True):
                assert cb.token_ids == ca.token_ids and cb.delta_token_ids == ca.delta_token_ids
                assert cb.text == cb.delta_text == "" and b_out.delta_text == ""
                assert (cb.finish_reason, cb.stop_reason) == (ca.finish_reason, ca.stop_reason)


def test_stop_strings_need_the_text() -> None:
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=["\n"], detokenize=False)


@pytest.mark.parametrize("bad", [1, "DELTA", None])
def test_a_bad_output_kind_is_named(bad) -> None:
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind=bad)


def test_a_bad_detokenize_is_named() -> None:
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(detokenize="no")


def test_generate_asks_for_final_outputs_only_and_leaves_the_params_alone(
    tiny_llama, monkeypatch
) -> None:
    llm = LLM(str(tiny_llama), block_size=4)
    built = []

    def request_output(**fields) -> RequestOutput:
        built.append(fields["request_id"])
        return RequestOutput(**fields)

    monkeypatch.setattr(output_processor, "RequestOutput", request_output)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(["ROMEO:", "JULIET:"], params, use_tqdm=False)
    assert params.output_kind == CUMULATIVE
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6]
    assert sorted(built) == sorted(o.request_id for o in outs)  # one completion each, at the end
