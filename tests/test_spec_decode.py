"""Speculative decoding with the n-gram proposer: the same output, in fewer steps.

Oracles: the engine without speculation (greedy output must be identical, in every scheduling
configuration), the verification rule written out as a plain reference, a chi-square test that
rejection sampling keeps the target distribution, a brute-force n-gram search, and the KV cache
manager's counters (no block leaks, blocks of rejected proposals back in the free queue).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduling_configs import speculative_engine_configs

from nanovllm import LLM, SamplingParams
from nanovllm.events import BlockFreed, RequestFinished, RequestScheduled, SpecTokensVerified
from nanovllm.executor.rejection_sampler import verify_greedy, verify_random
from nanovllm.spec_decode.ngram_proposer import NgramProposer
from nanovllm.speculative_config import SpeculativeConfig

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}  # fmt: skip


def repetitive_prompts(seed: int = 0) -> list[list[int]]:
    """Prompts whose tokens repeat, so the n-gram proposer finds matches from the start."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(5):
        motif = [rng.randrange(2, 250) for _ in range(rng.randint(2, 5))]
        prompts.append((motif * 8)[: rng.randint(6, 30)])
    return prompts


# --- the parts, against plain references ---------------------------------------------------------


def brute_force_propose(tokens: list[int], k: int, low: int, high: int) -> list[int]:
    for n in range(high, low - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        starts = [i for i in range(len(tokens) - n) if tokens[i : i + n] == suffix]
        if starts:
            i = max(starts)
            return tokens[i + n : i + n + k]
    return []


@settings(max_examples=examples(200), deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=30),
    k=st.integers(1, 5),
    low=st.integers(1, 3),
    extra=st.integers(0, 2),
)
def test_ngram_proposals_follow_the_latest_longest_match(tokens, k, low, extra) -> None:
    proposer = NgramProposer(k, low, low + extra)
    assert proposer.propose(tokens) == brute_force_propose(tokens, k, low, low + extra)


@settings(max_examples=examples(200), deadline=None)
@given(
    target=st.lists(st.integers(0, 3), min_size=1, max_size=6), data=st.data()
)  # fmt: skip
def test_greedy_verification_emits_what_plain_greedy_would(target, data) -> None:
    """Plain greedy emits target[0]; if the proposal matched, target[1] follows; and so on."""
    draft = data.draw(
        st.lists(st.integers(0, 3), min_size=len(target) - 1, max_size=len(target) - 1)
    )
    emitted = verify_greedy(target, draft)
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target[accepted]:
        accepted += 1
    assert emitted == target[: accepted + 1]


@pytest.mark.parametrize("draft_kind", ["point-mass", "draft-distribution"])
def test_rejection_sampling_keeps_the_target_distribution(draft_kind) -> None:
    """The first emitted token is distributed as p, whatever was proposed (chi-square, 5 tokens):
    the proposal is drawn from q, then verified against p."""
    p = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([[0.1, 0.1, 0.2, 0.3, 0.3]])
    n, counts = 6000, torch.zeros(5)
    rng = torch.Generator().manual_seed(0)
    for i in range(n):
        generator = torch.Generator().manual_seed(1000 + i)
        x = int(torch.multinomial(q[0], 1, generator=rng))
        if draft_kind == "point-mass":
            emitted = verify_random(p, [x], generator)
        else:
            emitted = verify_random(p, [x], generator, draft_probs=q)
        counts[emitted[0]] += 1
    expected = p[0] * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5, f"chi2={chi2:.1f} (4 dof, p < 0.001 beyond 18.5): {counts.tolist()}"


def test_a_point_mass_proposal_is_accepted_with_its_target_probability() -> None:
    p = torch.tensor([[0.1, 0.6, 0.3], [1.0, 0.0, 0.0]])
    accepted = sum(
        len(verify_random(p, [1], torch.Generator().manual_seed(i))) == 2 for i in range(4000)
    )
    assert abs(accepted / 4000 - 0.6) < 0.03


# --- the engine --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline(tiny_llama):
    prompts = repetitive_prompts()
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    llm = LLM(str(tiny_llama), block_size=16)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return prompts, params, [o.outputs[0].token_ids for o in outs]


@pytest.mark.quick
@settings(max_examples=examples(10), deadline=None)
@given(config=speculative_engine_configs)
def test_greedy_output_is_identical_with_speculation(tiny_llama, baseline, config) -> None:
    prompts, params, expected = baseline
    options, k = config
    llm = LLM(str(tiny_llama), speculative_config={**NGRAM, "num_speculative_tokens": k}, **options)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    engine = llm.llm_engine
    assert engine.kv_cache_manager.num_used_blocks == 0
    assert engine.stats.spec_decoding.num_draft_tokens > 0, "nothing was proposed: a vacuous run"


def test_speculation_takes_fewer_steps_and_returns_rejected_blocks(tiny_llama, baseline) -> None:
    prompts, params, expected = baseline

    def run(**options):
        llm = LLM(str(tiny_llama), block_size=1, **options)
        events = []
        llm.llm_engine.subscribe(events.append)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        return llm, events

    plain, plain_events = run()
    llm, events = run(speculative_config=NGRAM)
    stats = llm.llm_engine.stats.spec_decoding
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, "some accepted, some rejected"
    # Each accepted proposal saves its request one step.
    request_steps = sum(isinstance(e, RequestScheduled) for e in events)
    plain_request_steps = sum(isinstance(e, RequestScheduled) for e in plain_events)
    assert request_steps == plain_request_steps - stats.num_accepted_tokens
    verified = [e for e in events if isinstance(e, SpecTokensVerified)]
    assert sum(e.num_accepted for e in verified) == stats.num_accepted_tokens
    assert sum(len(e.proposed) for e in verified) == stats.num_draft_tokens
    # With one slot per block, each rejected proposal's block went back to the free queue at
    # once, while its request was still running.
    finished, freed_while_running = set(), 0
    for e in events:
        if isinstance(e, RequestFinished):
            finished.add(e.request_id)
        elif isinstance(e, BlockFreed) and e.request_id not in finished:
            freed_while_running += e.ref_count == 0
    rejected = stats.num_draft_tokens - stats.num_accepted_tokens
    assert freed_while_running >= rejected - len(prompts)  # (a finish can free the last ones)
    assert math.isclose(stats.acceptance_rate, stats.num_accepted_tokens / stats.num_draft_tokens)


def test_a_stop_inside_the_accepted_tokens_cuts_there(tiny_llama, baseline) -> None:
    prompts, _, expected = baseline
    i = max(range(len(expected)), key=lambda j: len(set(expected[j])))
    stop_token = expected[i][6]
    cut = expected[i].index(stop_token)
    params = SamplingParams(
        temperature=0, max_tokens=14, ignore_eos=True, stop_token_ids=[stop_token]
    )
    for options in (dict(), dict(speculative_config={**NGRAM, "num_speculative_tokens": 5})):
        llm = LLM(str(tiny_llama), block_size=4, **options)
        out = llm.generate([{"prompt_token_ids": prompts[i]}], params, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == expected[i][: cut + 1]
        assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_token
    exact = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompts[i]}], exact, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == expected[i][:9], "max_tokens holds exactly"


def test_seeded_sampling_with_speculation_is_reproducible(tiny_llama) -> None:
    prompts = repetitive_prompts(1)
    llm = LLM(str(tiny_llama), block_size=4, speculative_config=NGRAM)
    params = [
        SamplingParams(temperature=0.8, seed=i, max_tokens=12, ignore_eos=True, n=2)
        for i in range(5)
    ]
    first = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in first] == [
        [c.token_ids for c in o.outputs] for o in again
    ]
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"method": "eagle", "num_speculative_tokens": 2}, "unknown method 'eagle'"),
        (
            {"method": "ngram", "num_speculative_tokens": 0},
            "num_speculative_tokens must be an int >= 1, got 0",
        ),
        ({"method": "ngram"}, "num_speculative_tokens must be an int >= 1, got None"),
        ({**NGRAM, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min=4 exceeds"),
        ({**NGRAM, "prompt_lookup_min": 0}, "prompt_lookup_min must be an int >= 1, got 0"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        (
            {**NGRAM, "model": "/some/draft"},
            "'model' ('/some/draft') is for method 'draft_model', not 'ngram'",
        ),
        (
            {"model": "/some/draft", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            "['prompt_lookup_max'] apply to method 'ngram' only",
        ),
        ({**NGRAM, "bogus": 1}, "unknown keys ['bogus']"),
        ("ngram", "must be a dict"),
    ],
)
def test_bad_speculative_configs_name_the_value(config, needle) -> None:
    with pytest.raises(ValueError, match=None) as info:
        SpeculativeConfig.from_dict(config)
    assert needle in str(info.value)


def test_a_model_without_a_method_means_a_draft_model_as_in_vllm() -> None:
    config = SpeculativeConfig.from_dict({"model": "/some/draft", "num_speculative_tokens": 2})
    assert (config.method, config.model, config.num_lookahead_tokens) == (
        "draft_model", "/some/draft", 2,
    )  # fmt: skip
    assert SpeculativeConfig.from_dict(NGRAM).num_lookahead_tokens == 0


def test_lookup_sizes_default_as_in_vllm() -> None:
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 2}).prompt_lookup_max == 5
    config = SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_max": 3})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (3, 3)


def test_each_steps_proposals_replace_the_last() -> None:
    """The speculator keeps one step's proposals: a request that stops decoding (preempted, or
    no longer in the running list) is asked for none, never for the ones of a step before."""
    from nanovllm.core.kv_cache_manager import KVCacheManager
    from nanovllm.request import Request
    from nanovllm.spec_decode.metrics import SpecDecodingStats
    from nanovllm.spec_decode.speculator import NoSpeculation, Speculator

    speculator = Speculator(NgramProposer(2, 1, 2), SpecDecodingStats())
    kv = KVCacheManager(16, 4, False)
    a, b = (Request(rid, [5, 6, 5, 6, 5], SamplingParams(max_tokens=8), i) for i, rid in
            enumerate("ab"))  # fmt: skip
    for r in (a, b):
        r.max_tokens, r.num_computed_tokens = 8, r.num_tokens - 1  # decoding
    speculator.propose([a, b], kv)
    assert speculator.tokens_to_verify(a) == [6, 5] == speculator.tokens_to_verify(b)
    b.num_computed_tokens = 0  # preempted: it recomputes before it decodes again
    speculator.propose([a, b], kv)
    assert speculator.tokens_to_verify(a) == [6, 5] and speculator.tokens_to_verify(b) == []
    speculator.propose([b], kv)
    assert speculator.tokens_to_verify(a) == []
    assert NoSpeculation().tokens_to_verify(a) == []
