"""vLLM's logits-processing `SamplingParams` against independent oracles.

- Greedy parity with transformers' `generate` and its matching logits processor, token for
  token, on a random-weight checkpoint: `repetition_penalty`, `min_tokens` (`min_new_tokens`,
  with the stop token set to a token greedy decoding emits early), `bad_words` (`bad_words_ids`
  from the same tokenization), `logit_bias` (`sequence_bias`), `allowed_token_ids`
  (`prefix_allowed_tokens_fn`); `presence_penalty` / `frequency_penalty` against a
  transformers logits processor written here from OpenAI's definition.
- All of them in one mixed batch with plain greedy requests, under scheduling configurations
  that chunk prefills and force preemption, and with speculative decoding: every request gets
  exactly the tokens it gets alone from transformers.
- The processors on random logits (hypothesis) against a loop written from the definitions and
  transformers' `RepetitionPenaltyLogitsProcessor`.
- `cumulative_logprob`, `Logprob.rank` and `Logprob.decoded_token` against transformers' full
  forward pass, a sort and the tokenizer.
- Bad values: refused with the value named, the engine keeps serving, no block leaks.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import make_model

from nanovllm import LLM, LLMEngine, SamplingParams
from nanovllm.config import EngineConfig
from nanovllm.executor.logits_processors import apply_logits_processors
from nanovllm.request import Request

VOCAB = 512
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("sp_llama"), vocab_size=VOCAB, num_kv_heads=2)


@pytest.fixture(scope="module")
def hf_model(model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


def prompts(seed: int = 0, count: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, VOCAB) for _ in range(rng.randint(3, 24))] for _ in range(count)]


class OpenAIPenalties:
    """A transformers logits processor from OpenAI's definition of the two penalties:
    logits[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty, c[j] counting j in
    the tokens generated so far (after the prompt's `prompt_len`)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        for row in range(scores.shape[0]):
            generated = input_ids[row, self.prompt_len :].tolist()
            for token in set(generated):
                count = generated.count(token)
                scores[row, token] -= count * self.frequency + self.presence
        return scores


def hf_generate(hf_model, prompt: list[int], params: SamplingParams) -> list[int]:
    """transformers' greedy `generate` with the processor matching each of `params`' fields."""
    from transformers import LogitsProcessorList

    kwargs: dict = {}
    stops = list(params.stop_token_ids)
    if params.repetition_penalty != 1:
        kwargs["repetition_penalty"] = params.repetition_penalty
    if params.min_tokens:
        kwargs["min_new_tokens"] = params.min_tokens
    if params.bad_words_token_ids:
        kwargs["bad_words_ids"] = params.bad_words_token_ids
    if params.logit_bias:
        kwargs["sequence_bias"] = {(t,): b for t, b in params.logit_bias.items()}
    if params.allowed_token_ids is not None:
        allowed = list(params.allowed_token_ids)
        kwargs["prefix_allowed_tokens_fn"] = lambda batch_id, ids: allowed
    if params.presence_penalty or params.frequency_penalty:
        kwargs["logits_processor"] = LogitsProcessorList(
            [OpenAIPenalties(len(prompt), params.presence_penalty, params.frequency_penalty)]
        )
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=params.max_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=stops or None,
            **kwargs,
        )
    return out[0, len(prompt) :].tolist()


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, **fields)


def settings_for(tokenizer, plain: list[list[int]]) -> list[tuple[int, SamplingParams]]:
    """(prompt index, params) per setting, chosen so that each changes the greedy output: the
    stop token and the banned, biased and allowed tokens are ones greedy decoding emits there."""
    words = [tokenizer.decode([plain[0][1]]), tokenizer.decode(plain[0][2:4])]
    bad = greedy(bad_words=[w for w in words if w.strip()])
    bad.update_from_tokenizer(tokenizer)
    return [
        (2, greedy(repetition_penalty=1.8)),
        (0, greedy(repetition_penalty=0.6)),
        (0, greedy(min_tokens=6, stop_token_ids=[plain[0][2]])),
        (0, bad),
        (1, greedy(logit_bias={plain[1][0]: -8.0, plain[1][3]: 3.5, 17: 5.0})),
        (2, greedy(allowed_token_ids=sorted({*plain[2][2:6], 40, 41}))),
        (1, greedy(presence_penalty=-2.0)),
        (2, greedy(frequency_penalty=-1.5)),
        (1, greedy(logit_bias={17: 5.0}, presence_penalty=2.0)),
        (1, greedy(logit_bias={17: 4.0}, presence_penalty=1.0, frequency_penalty=0.5)),
    ]


@pytest.fixture(scope="module")
def cases(hf_model, tokenizer):
    """(prompt, params, transformers' tokens) for every setting, plus plain greedy requests."""
    ps = prompts(0, 3)
    plain = [hf_generate(hf_model, p, greedy()) for p in ps]
    out = []
    for i, params in settings_for(tokenizer, plain):
        prompt = ps[i]
        out.append((prompt, params, hf_generate(hf_model, prompt, params)))
    for prompt, tokens in zip(ps, plain):
        out.append((prompt, greedy(), tokens))
    return out


def run_engine(model_path: Path, cases, **options) -> list[list[int]]:
    llm = LLM(str(model_path), **options)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p, _, _ in cases], [c[1] for c in cases], use_tqdm=False
    )
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0, "blocks leaked after the run"
    return [o.outputs[0].token_ids for o in outs]


def test_each_setting_changes_the_output(cases) -> None:
    """The oracle outputs differ from plain greedy's, so the parity below is not vacuous."""
    plain = {tuple(p): tokens for p, params, tokens in cases if not params.uses_logits_processors}
    for prompt, params, tokens in cases:
        if params.uses_logits_processors:
            assert tokens != plain[tuple(prompt)], params


def test_each_setting_alone_matches_transformers(model_path, cases) -> None:
    for case in cases:
        assert run_engine(model_path, [case]) == [case[2]], case[1]


def test_min_tokens_holds_back_the_models_eos(model_path, hf_model, tmp_path) -> None:
    """The checkpoint's own EOS (config.json) set to a token greedy decoding emits early."""
    prompt = prompts(3, 1)[0]
    early = hf_generate(hf_model, prompt, greedy())[1]
    path = tmp_path / "eos"
    shutil.copytree(model_path, path)
    config = json.loads((path / "config.json").read_text())
    config["eos_token_id"] = early
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").unlink(missing_ok=True)
    llm = LLM(str(path))
    for min_tokens in (0, 1, 4):
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, min_tokens=min_tokens)
        got = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        hf_params = greedy(min_tokens=min_tokens, stop_token_ids=[early])
        assert got.outputs[0].token_ids == hf_generate(hf_model, prompt, hf_params)
        tokens = got.outputs[0].token_ids
        assert early not in tokens[:min_tokens]
        if min_tokens <= 1:  # EOS, second, is allowed: it ends the request there
            assert len(tokens) == 2 and got.outputs[0].finish_reason == "stop"
        else:
            assert len(tokens) > 2


engine_configs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 4, 16]),
        "num_kv_blocks": st.sampled_from([16, 1024]),  # with block_size 4: preemption
        "max_num_batched_tokens": st.sampled_from([5, 17, 2048]),
        "max_num_seqs": st.sampled_from([1, 3, 16]),
        "enable_prefix_caching": st.booleans(),
    }
)


@settings(max_examples=examples(4), deadline=None)
@given(config=engine_configs)
def test_mixed_batch_under_scheduling_configs(model_path, cases, config) -> None:
    """Every setting and plain greedy requests in one batch: each request's tokens are those
    transformers gives it alone (so no request's processors touch another's rows)."""
    if config["block_size"] * config["num_kv_blocks"] < 64:
        config["num_kv_blocks"] = 64 // config["block_size"]
    assert run_engine(model_path, cases, **config) == [c[2] for c in cases]


def test_a_small_cache_preempts_and_still_matches(model_path, cases) -> None:
    llm = LLM(str(model_path), block_size=4, num_kv_blocks=14, max_num_batched_tokens=9)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p, _, _ in cases], [c[1] for c in cases], use_tqdm=False
    )
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == [c[2] for c in cases]


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_decoding_counts_the_proposals(model_path, cases, k: int) -> None:
    """With n-gram proposals each verified row sees the proposals before it as output."""
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1}
    assert run_engine(model_path, cases, speculative_config=spec) == [c[2] for c in cases]


# ---- the processors on random logits, against the definitions ----


def reference(
    logits: torch.Tensor, prompt: list[int], output: list[int], params: SamplingParams, eos: int
) -> torch.Tensor:
    """One row, one token at a time, from each field's definition (vLLM's order)."""
    from transformers import RepetitionPenaltyLogitsProcessor

    row = logits.clone()
    vocab = row.shape[0]
    if params.allowed_token_ids is not None:
        for t in range(vocab):
            if t not in params.allowed_token_ids:
                row[t] = float("-inf")
    for word in params.bad_words_token_ids:
        if len(word) == 1 or output[-(len(word) - 1) :] == word[:-1]:
            row[word[-1]] = float("-inf")
    if len(output) < params.min_tokens:
        for t in [*([] if params.ignore_eos else [eos]), *params.stop_token_ids]:
            row[t] = float("-inf")
    for t, b in (params.logit_bias or {}).items():
        row[t] += b
    if params.repetition_penalty != 1:
        hf = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)
        row = hf(torch.tensor([prompt + output]), row[None])[0]
    for t in set(output):
        row[t] -= output.count(t) * params.frequency_penalty + params.presence_penalty
    return row


class WordTokenizer:
    """Each bad word's tokens, as given (its spaced form tokenizes the same)."""

    def __init__(self, words: dict[str, list[int]]) -> None:
        self.words = words

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.words[text.strip()]


def make_request(i: int, prompt: list[int], output: list[int], params: SamplingParams) -> Request:
    request = Request(f"r{i}", prompt, params, i, eos_token_ids=frozenset({1}))
    for token in output:
        request.append_output_token(token)
    return request


small_vocab = 24
token_lists = st.lists(st.integers(0, small_vocab - 1), max_size=12)
penalties = st.floats(-2, 2, allow_nan=False)
params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.7]),
    presence_penalty=st.one_of(st.just(0.0), penalties),
    frequency_penalty=st.one_of(st.just(0.0), penalties),
    repetition_penalty=st.sampled_from([1.0, 0.5, 1.3, 2.0]),
    min_tokens=st.integers(0, 6),
    stop_token_ids=st.lists(st.integers(0, small_vocab - 1), max_size=2),
    ignore_eos=st.booleans(),
    logit_bias=st.one_of(
        st.none(), st.dictionaries(st.integers(0, small_vocab - 1), st.floats(-100, 100))
    ),
    allowed_token_ids=st.one_of(
        st.none(), st.lists(st.integers(0, small_vocab - 1), min_size=1, max_size=6)
    ),
)


@settings(max_examples=examples(60), deadline=None)
@given(
    batch=st.lists(
        st.tuples(
            token_lists.filter(bool),
            token_lists,
            params_strategy,
            st.lists(st.lists(st.integers(0, small_vocab - 1), min_size=1, max_size=3)),
            st.lists(st.integers(0, small_vocab - 1), max_size=3),
        ),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_processors_match_the_definitions(batch, seed: int) -> None:
    """Each row of a batch (with proposals: 1 + k rows per request) equals the reference
    applied to that row alone, with the proposals before it counted as output."""
    requests, spec = [], []
    for i, (prompt, output, params, bad_words, proposed) in enumerate(batch):
        if bad_words:
            words = {f"w{n}": list(w) for n, w in enumerate(bad_words)}
            params = dataclasses.replace(params, bad_words=list(words))
            params.update_from_tokenizer(WordTokenizer(words))
        requests.append(make_request(i, prompt, output, params))
        spec.append(proposed)
    num_rows = sum(1 + len(p) for p in spec)
    logits = torch.randn(num_rows, small_vocab, generator=torch.Generator().manual_seed(seed)) * 3
    got = apply_logits_processors(logits, requests, spec)
    row = 0
    for request, proposed in zip(requests, spec):
        for j in range(1 + len(proposed)):
            output = request.output_token_ids + proposed[:j]
            want = reference(
                logits[row], request.prompt_token_ids, output, request.sampling_params, 1
            )
            torch.testing.assert_close(got[row], want, rtol=1e-5, atol=1e-5)
            row += 1


def test_requests_without_settings_get_their_logits_untouched() -> None:
    logits = torch.randn(3, small_vocab)
    requests = [make_request(i, [2, 3], [4], SamplingParams(temperature=0)) for i in range(3)]
    assert apply_logits_processors(logits, requests) is logits


# ---- logprobs: cumulative, rank, decoded token ----


def test_logprob_rank_decoded_token_and_cumulative(model_path, hf_model, tokenizer) -> None:
    prompt = prompts(5, 1)[0]
    llm = LLM(str(model_path))
    for params in (
        SamplingParams(temperature=0.9, seed=3, max_tokens=6, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=4, logprobs=-1, ignore_eos=True),
    ):
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
        with torch.no_grad():
            full = hf_model(torch.tensor([prompt + out.token_ids])).logits[0].log_softmax(-1)
        rows = full[len(prompt) - 1 : -1]  # the row that scored each output token
        total = 0.0
        for token, row, entry in zip(out.token_ids, rows, out.logprobs):
            order = row.argsort(descending=True).tolist()
            for t, lp in entry.items():
                assert lp.logprob == pytest.approx(row[t].item(), abs=1e-4)
                assert lp.decoded_token == tokenizer.decode([t])
                # rank: 1 + how many tokens are strictly more likely (no ties in random logits)
                assert lp.rank == order.index(t) + 1
            want_n = VOCAB if params.logprobs == -1 else params.logprobs
            assert len(entry) in (want_n, want_n + 1)
            total += row[token].item()
        assert out.cumulative_logprob == pytest.approx(total, abs=1e-3)
    plain = llm.generate([{"prompt_token_ids": prompt}], greedy(), use_tqdm=False)[0]
    assert plain.outputs[0].cumulative_logprob is None  # as vLLM: only with logprobs


# ---- bad values ----


@pytest.mark.parametrize(
    "fields, needle",
    [
        (dict(presence_penalty=2.5), "2.5"),
        (dict(frequency_penalty=-3), "-3"),
        (dict(presence_penalty=float("nan")), "nan"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(repetition_penalty=-1.0), "-1.0"),
        (dict(min_tokens=-1), "-1"),
        (dict(min_tokens=20, max_tokens=10), "20"),
        (dict(logit_bias={"x": 1.0}), "'x'"),
        (dict(logit_bias={-4: 1.0}), "-4"),
        (dict(logit_bias={3: float("inf")}), "inf"),
        (dict(allowed_token_ids=[]), "[]"),
        (dict(allowed_token_ids=[1, -2]), "-2"),
        (dict(bad_words=[""]), "''"),
        (dict(bad_words="word"), "'word'"),
        (dict(logprobs=-2), "-2"),
        (dict(prompt_logprobs=-5), "-5"),
    ],
)
def test_bad_values_are_refused_naming_them(fields: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        SamplingParams(**fields)
    message = str(info.value)
    assert needle in message
    assert next(iter(fields)) in message


def test_logit_bias_is_clamped_and_string_keys_accepted() -> None:
    params = SamplingParams(logit_bias={"5": 250.0, 6: -1000})
    assert params.logit_bias == {5: 100.0, 6: -100.0}


@pytest.mark.parametrize(
    "fields, needle",
    [
        (dict(logit_bias={VOCAB: 1.0}), str(VOCAB)),
        (dict(logit_bias={3: 1.0, 10**6: 1.0}), str(10**6)),
        (dict(allowed_token_ids=[3, VOCAB + 7]), str(VOCAB + 7)),
        (dict(logprobs=VOCAB + 1), str(VOCAB + 1)),
    ],
)
def test_out_of_vocabulary_ids_are_refused_and_the_engine_keeps_serving(
    model_path, fields: dict, needle: str
) -> None:
    engine = LLMEngine(EngineConfig(model=str(model_path), block_size=4, num_kv_blocks=32))
    prompt = {"prompt_token_ids": prompts(1, 1)[0]}
    engine.add_request("before", prompt, greedy())
    engine.step()
    with pytest.raises(ValueError) as info:
        engine.add_request("bad", prompt, greedy(**fields))
    assert needle in str(info.value)
    assert next(iter(fields)) in str(info.value)
    final = engine.run_until_done()
    assert "bad" not in final and len(final["before"].outputs[0].token_ids) == MAX_TOKENS
    assert engine.kv_cache_manager.num_used_blocks == 0, "a block leaked"
    assert not engine.scheduler.requests


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "random"])
def test_a_request_that_masks_every_token_finishes_alone_with_an_error(
    model_path, temperature: float
) -> None:
    """`allowed_token_ids=[s]` with `stop_token_ids=[s]` and `min_tokens=1` leaves no token for
    the first step: the request finishes with an error naming it (a greedy argmax over a row of
    -inf would hand out token 0, which it never allowed); the other request is untouched."""
    engine = LLMEngine(EngineConfig(model=str(model_path), block_size=4, num_kv_blocks=32))
    prompt = {"prompt_token_ids": prompts(2, 1)[0]}
    engine.add_request("before", prompt, greedy())
    alone = LLMEngine(EngineConfig(model=str(model_path), block_size=4, num_kv_blocks=32))
    alone.add_request("before", prompt, greedy())
    blocked = dict(allowed_token_ids=[7], stop_token_ids=[7], min_tokens=1)
    params = SamplingParams(temperature=temperature, max_tokens=4, seed=0, **blocked)
    engine.add_request("masked", prompt, params)
    final = engine.run_until_done()
    masked = final["masked"]
    assert masked.outputs[0].finish_reason == "error" and masked.outputs[0].token_ids == []
    assert "'masked'" in masked.error and "every token masked" in masked.error
    want = alone.run_until_done()["before"].outputs[0].token_ids
    assert final["before"].outputs[0].token_ids == want
    assert engine.kv_cache_manager.num_used_blocks == 0, "a block leaked"


# ---- prompt logprobs ----


def hf_prompt_logprobs(hf_model, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab]: row i is log_softmax of the logits that score prompt[i + 1]."""
    with torch.no_grad():
        return hf_model(torch.tensor([prompt])).logits[0, :-1].log_softmax(-1)


def check_prompt_logprobs(output, hf_model, n: int) -> None:
    prompt = output.prompt_token_ids
    want = hf_prompt_logprobs(hf_model, prompt)
    got = output.prompt_logprobs
    assert len(got) == len(prompt) and got[0] is None
    for i in range(1, len(prompt)):
        row, entry = want[i - 1], got[i]
        order = row.argsort(descending=True).tolist()
        top = set(order[: VOCAB if n == -1 else n])
        assert set(entry) == top | {prompt[i]}
        for t, lp in entry.items():
            assert lp.logprob == pytest.approx(row[t].item(), abs=1e-4)
            assert lp.rank == order.index(t) + 1


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(block_size=4, max_num_batched_tokens=7),  # chunked prefill
        dict(block_size=4, num_kv_blocks=14, max_num_batched_tokens=9),  # preemption
    ],
    ids=["one-step", "chunked", "preempted"],
)
def test_prompt_logprobs_match_transformers(model_path, hf_model, cases, options) -> None:
    """Prompt logprobs in a batch with every other setting, under chunking and preemption;
    the other requests' tokens are still transformers'."""
    llm = LLM(str(model_path), **options)
    ps = prompts(7, 3)
    asks = [greedy(prompt_logprobs=n) for n in (0, 3, -1)]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in ps] + [{"prompt_token_ids": c[0]} for c in cases],
        asks + [c[1] for c in cases],
        use_tqdm=False,
    )
    for out, params in zip(outs, asks):
        check_prompt_logprobs(out, hf_model, params.prompt_logprobs)
    assert [o.outputs[0].token_ids for o in outs[3:]] == [c[2] for c in cases]
    assert all(o.prompt_logprobs is None for o in outs[3:])
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0
    if "num_kv_blocks" in options:
        assert llm.llm_engine.scheduler.num_preemptions > 0


def test_prompt_logprobs_read_nothing_from_the_prefix_cache(model_path, hf_model) -> None:
    """vLLM's rule: a request asking for prompt logprobs computes its whole prompt, even when
    the prefix cache holds it; its blocks still serve the requests after it."""
    llm = LLM(str(model_path), block_size=4)
    prompt = {"prompt_token_ids": prompts(8, 1)[0] * 2}
    llm.generate([prompt], greedy(), use_tqdm=False)
    asked = llm.generate([prompt], greedy(prompt_logprobs=2), use_tqdm=False)[0]
    assert asked.num_cached_tokens == 0
    check_prompt_logprobs(asked, hf_model, 2)
    again = llm.generate([prompt], greedy(), use_tqdm=False)[0]
    assert again.num_cached_tokens > 0


def test_two_tensor_parallel_ranks_apply_them_too(model_path, hf_model, cases) -> None:
    """Under tensor parallelism (2 processes) the same settings give transformers' tokens, and
    the prompt logprobs' rows come back from the ranks with the sampling rows."""
    llm = LLM(str(model_path), tensor_parallel_size=2, block_size=4, max_num_batched_tokens=9)
    try:
        ps = prompts(9, 2)
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in ps] + [{"prompt_token_ids": c[0]} for c in cases],
            [greedy(prompt_logprobs=2), greedy(prompt_logprobs=0)] + [c[1] for c in cases],
            use_tqdm=False,
        )
        check_prompt_logprobs(outs[0], hf_model, 2)
        check_prompt_logprobs(outs[1], hf_model, 0)
        assert [o.outputs[0].token_ids for o in outs[2:]] == [c[2] for c in cases]
    finally:
        llm.llm_engine.shutdown()


def test_parallel_sampling_reports_the_prompt_logprobs_once(model_path, hf_model) -> None:
    llm = LLM(str(model_path))
    params = SamplingParams(n=3, temperature=0.8, seed=1, max_tokens=3, prompt_logprobs=1)
    out = llm.generate([{"prompt_token_ids": prompts(4, 1)[0]}], params, use_tqdm=False)[0]
    assert len(out.outputs) == 3
    check_prompt_logprobs(out, hf_model, 1)
