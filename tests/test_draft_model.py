"""Speculative decoding with a draft model: the target's output, with the draft's guesses verified.

Oracles:
- transformers' greedy `generate` on the target: the engine's greedy output with a draft model
  must equal it in every scheduling configuration (tiny blocks, preemption, chunked prefill,
  prefix caching);
- transformers' greedy `generate` on the *draft*: every proposal must be the draft model's own
  greedy continuation of the request's tokens at that moment. This checks the draft's paged KV
  cache (kept in step with the target's through the same slots, and written ahead into the
  lookahead slots) after preemption, rejected proposals and prefix-cache hits;
- sampling without speculation: with temperature 1, the distribution of tokens that went through
  verification equals the plain engine's (a two-sample chi-square test on a tiny vocabulary);
- the KV cache manager's counters: no block leaks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from budget import examples
from hypothesis import given, settings
from scheduling_configs import speculative_engine_configs
from tiny_models import hf_greedy, make_draft, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.events import SpecTokensVerified, TokenEmitted

PROMPTS = [[5, 6, 7, 8, 9] * 3, [10, 11, 12], list(range(20, 60)), [30, 31, 30, 31, 30]]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def models(tiny_llama, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drafts")
    return {
        "target": tiny_llama,
        # The target's weights with a little noise: about a third of its guesses are accepted.
        "close": make_draft(tiny_llama, root / "close", noise=0.05),
        # Its first layer alone: another KV shape (one layer), guesses mostly rejected.
        "one_layer": make_draft(tiny_llama, root / "one_layer", num_layers=1),
    }


@pytest.fixture(scope="module")
def expected(models) -> list[list[int]]:
    return hf_greedy(models["target"], PROMPTS, MAX_TOKENS)


def draft_config(path: Path, k: int = 3) -> dict:
    return {"model": str(path), "num_speculative_tokens": k}


def generate(llm: LLM, params: SamplingParams | None = None) -> list[list[int]]:
    params = params or SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@settings(max_examples=examples(8), deadline=None)
@given(config=speculative_engine_configs)
def test_greedy_output_with_a_draft_model_equals_transformers(models, expected, config) -> None:
    options, k = config
    llm = LLM(str(models["target"]), speculative_config=draft_config(models["close"], k), **options)
    assert generate(llm) == expected
    engine = llm.llm_engine
    assert engine.kv_cache_manager.num_used_blocks == 0, "a block leaked"
    assert engine.stats.spec_decoding.num_draft_tokens > 0, "nothing was proposed: a vacuous run"


@pytest.mark.parametrize("draft", ["close", "one_layer"])
def test_every_proposal_is_the_draft_models_own_greedy_continuation(models, expected, draft):
    """Replays the events: at each verification, the request's tokens so far, continued by
    transformers' greedy draft model, must give exactly the proposed tokens. Block size 2 and
    40 blocks force preemption; the second run of the same prompts hits the prefix cache."""
    llm = LLM(
        str(models["target"]),
        block_size=2,
        num_kv_blocks=40,
        max_num_batched_tokens=16,
        speculative_config=draft_config(models[draft], 4),
    )
    events = []
    llm.llm_engine.subscribe(events.append)
    assert generate(llm) == expected
    assert generate(llm) == expected  # again: every prompt's blocks are cached now
    assert llm.llm_engine.scheduler.num_preemptions > 0, "no preemption: a weaker test"
    assert llm.llm_engine.scheduler.prefix_cache_hits > 0

    tokens: dict[str, list[int]] = {}  # each request's output so far, from its events
    cases: list[tuple[list[int], tuple[int, ...]]] = []
    for e in events:
        if isinstance(e, SpecTokensVerified):
            # Verified in this step: proposed after the previous step, from the tokens then.
            # (`generate` numbers its requests 1, 2, ... in order; both calls give PROMPTS.)
            prompt = PROMPTS[(int(e.request_id) - 1) % len(PROMPTS)]
            cases.append((prompt + tokens.get(e.request_id, []), e.proposed))
        elif isinstance(e, TokenEmitted):
            tokens.setdefault(e.request_id, []).append(e.token_id)
    assert len(cases) > 10
    for context, proposed in sorted(set((tuple(c), p) for c, p in cases)):
        context = list(context)
        (draft_tokens,) = hf_greedy(models[draft], [context], len(proposed))
        assert list(proposed) == draft_tokens, f"after {context}"


def test_a_perfect_draft_is_always_accepted_and_saves_steps(models, expected) -> None:
    """The target as its own draft: every guess is right, so each verifying step emits k + 1
    tokens (fewer only where max_tokens cuts the proposal)."""
    k = 3
    llm = LLM(str(models["target"]), speculative_config=draft_config(models["target"], k))
    events = []
    llm.llm_engine.subscribe(events.append)
    assert generate(llm) == expected
    stats = llm.llm_engine.stats.spec_decoding
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    # Per request: one prefill step, then steps of k + 1 tokens until max_tokens.
    steps_per_request = 1 + math.ceil((MAX_TOKENS - 1) / (k + 1))
    assert stats.num_drafts == len(PROMPTS) * (steps_per_request - 1)
    assert max(e.step for e in events if isinstance(e, TokenEmitted)) == steps_per_request


def test_sampling_through_a_draft_keeps_the_target_distribution(tmp_path) -> None:
    """Temperature 1 on a model with 8 tokens: the 2nd and 3rd tokens (each verified against
    the draft's guesses, or the bonus token after them) are distributed as without speculation.
    Two-sample chi-square per position, 7 degrees of freedom, p < 0.001 beyond 24.3."""
    target = make_model(tmp_path / "target", vocab_size=8, init_range=0.5, seed=3)
    draft = make_draft(target, tmp_path / "draft", noise=0.3)
    n = 1500
    prompts = [{"prompt_token_ids": [1 + i % 3, 4]} for i in range(n)]

    def positions(**options) -> list[list[int]]:
        llm = LLM(str(target), max_num_seqs=256, **options)
        params = [
            SamplingParams(temperature=1.0, seed=i, max_tokens=3, ignore_eos=True) for i in range(n)
        ]
        outs = llm.generate(prompts, params, use_tqdm=False)
        if options:
            stats = llm.llm_engine.stats.spec_decoding
            assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
        return [[o.outputs[0].token_ids[j] for o in outs] for j in (1, 2)]

    plain = positions()
    speculative = positions(speculative_config=draft_config(draft, 2))
    for j, (a, b) in enumerate(zip(plain, speculative)):
        chi2 = two_sample_chi2([a.count(t) for t in range(8)], [b.count(t) for t in range(8)])
        assert chi2 < 24.3, f"token {j + 2}: chi2={chi2:.1f}"


def two_sample_chi2(a: list[int], b: list[int]) -> float:
    na, nb = sum(a), sum(b)
    chi2 = 0.0
    for x, y in zip(a, b):
        if x + y == 0:
            continue
        ea, eb = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        chi2 += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return chi2


def test_seeded_sampling_with_a_draft_is_reproducible_and_leaks_nothing(models) -> None:
    llm = LLM(str(models["target"]), block_size=4, speculative_config=draft_config(models["close"]))
    params = [
        SamplingParams(temperature=0.8, seed=i, max_tokens=10, ignore_eos=True, n=2)
        for i in range(len(PROMPTS))
    ]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    first = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate(prompts, params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in first] == [
        [c.token_ids for c in o.outputs] for o in again
    ]
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


def test_a_request_that_cannot_hold_its_lookahead_slots_is_refused(models) -> None:
    llm = LLM(
        str(models["target"]),
        block_size=4,
        num_kv_blocks=8,
        speculative_config=draft_config(models["close"], 3),
    )
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(ValueError, match=r"needs 31 KV slots \+ 3 lookahead slots"):
        llm.generate([{"prompt_token_ids": list(range(28))}], params, use_tqdm=False)
    assert llm.generate([{"prompt_token_ids": list(range(26))}], params, use_tqdm=False)


def test_bad_draft_models_are_refused_by_name(models, tmp_path) -> None:
    target = str(models["target"])

    def refused(path, needle: str, **options) -> None:
        with pytest.raises(ValueError) as info:
            LLM(target, speculative_config=draft_config(path), **options)
        assert needle in str(info.value), str(info.value)

    refused(tmp_path / "nowhere", "draft model folder")
    other_vocab = make_model(tmp_path / "vocab", vocab_size=300)
    refused(other_vocab, "vocab_size=300")
    vocab_size = json.loads((models["target"] / "config.json").read_text())["vocab_size"]
    other_tokenizer = make_model(
        tmp_path / "tokenizer", tokenizer="metaspace", vocab_size=vocab_size
    )
    refused(other_tokenizer, "another tokenizer")
    short = make_model(tmp_path / "short", max_position=64)
    refused(short, "handles 64 positions, fewer than max_model_len=512")
    LLM(target, speculative_config=draft_config(short), max_model_len=64)  # fits
