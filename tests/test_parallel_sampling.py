"""Parallel sampling, `SamplingParams(n=k)`: k completions of one prompt, which is computed once.

Oracles: the same prompt run with n = 1 (greedy, or with child i's seed), the engine's own
events (how many prompt tokens each child computed, how many owners the prompt's blocks have),
and the KV cache manager's counters after every run (no block leaks).
"""

from __future__ import annotations

import pytest

from nanovllm import LLM, LLMEngine, SamplingParams
from nanovllm.config import EngineConfig
from nanovllm.events import CacheHit, RequestScheduled

PROMPT = list(range(5, 5 + 38))  # 38 tokens: 9 full blocks of 4 and a partial one


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), block_size=4)


def run(llm: LLM, params: SamplingParams, prompt=PROMPT):
    return llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]


def test_greedy_children_all_equal_the_greedy_output(llm: LLM) -> None:
    greedy = run(llm, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    out = run(llm, SamplingParams(n=4, temperature=0, max_tokens=10, ignore_eos=True))
    assert out.finished and [c.index for c in out.outputs] == [0, 1, 2, 3]
    for completion in out.outputs:
        assert completion.token_ids == greedy.outputs[0].token_ids
        assert completion.text == greedy.outputs[0].text
        assert completion.finish_reason == "length"
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


def test_child_i_draws_with_seed_plus_i_whatever_shares_its_batch(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=0.9, seed=11, max_tokens=10, ignore_eos=True)
    out = run(llm, params)
    for i, completion in enumerate(out.outputs):
        alone = run(
            llm, SamplingParams(temperature=0.9, seed=11 + i, max_tokens=10, ignore_eos=True)
        )
        assert completion.token_ids == alone.outputs[0].token_ids
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "children drew the same tokens"


def test_the_prompt_is_computed_once_and_its_blocks_have_n_owners(tiny_llama) -> None:
    # A token budget below the prompt's length: child 0 prefills in chunks, and the others
    # must wait for it rather than compute the same blocks beside it.
    llm = LLM(str(tiny_llama), block_size=4, max_num_batched_tokens=16)
    events = []
    llm.llm_engine.subscribe(events.append)
    n = 3
    run(llm, SamplingParams(n=n, temperature=0.7, max_tokens=4, ignore_eos=True))
    prefill = {}
    for e in events:
        if isinstance(e, RequestScheduled) and e.num_computed_tokens < len(PROMPT):
            prefill[e.request_id] = prefill.get(e.request_id, 0) + e.num_tokens
    full_blocks = (len(PROMPT) - 1) // 4  # a hit always leaves a token to compute
    leader = next(rid for rid in prefill if rid.startswith("0_"))
    assert prefill[leader] == len(PROMPT), "child 0 computes the whole prompt"
    assert sorted(prefill.values()) == [len(PROMPT) - 4 * full_blocks] * (n - 1) + [len(PROMPT)]
    owners = max(e.ref_count for e in events if isinstance(e, CacheHit))
    assert owners == n, "the prompt's first block is shared by every child"
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


def test_streamed_deltas_add_up_per_child(tiny_llama) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4))
    engine.add_request(
        "p",
        {"prompt_token_ids": PROMPT},
        SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=9, ignore_eos=True),
    )
    streamed = ["", ""]
    final = None
    for output in engine.stream():
        assert output.request_id == "p" and len(output.outputs) == 2
        for completion in output.outputs:
            streamed[completion.index] += completion.delta_text
        final = output
    assert final.finished
    assert streamed == [c.text for c in final.outputs]


def test_aborting_the_parent_aborts_every_child(tiny_llama) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4))
    engine.add_request(
        "p", {"prompt_token_ids": PROMPT}, SamplingParams(n=3, max_tokens=50, ignore_eos=True)
    )
    engine.add_request(
        "other", "ROMEO:", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )
    for _ in range(3):
        engine.step()
    aborted = engine.abort_request("p")
    assert aborted.finished and [c.finish_reason for c in aborted.outputs] == ["abort"] * 3
    final = engine.run_until_done()
    assert final["other"].outputs[0].finish_reason == "length"
    assert engine.kv_cache_manager.num_used_blocks == 0
    assert not engine.output_processor.parent_requests
    with pytest.raises(ValueError, match="'p'"):
        engine.abort_request("p")


def test_under_preemption_every_child_still_equals_greedy(tiny_llama) -> None:
    big = LLM(str(tiny_llama), block_size=4)
    greedy = run(big, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    tight = LLM(str(tiny_llama), block_size=4, num_kv_blocks=16, max_num_batched_tokens=16)
    out = run(tight, SamplingParams(n=3, temperature=0, max_tokens=12, ignore_eos=True))
    assert tight.llm_engine.scheduler.num_preemptions > 0
    assert all(c.token_ids == greedy.outputs[0].token_ids for c in out.outputs)
    assert tight.llm_engine.kv_cache_manager.num_used_blocks == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_a_bad_n_is_named(bad) -> None:
    with pytest.raises(ValueError, match=f"n must be an int >= 1, got {bad!r}"):
        SamplingParams(n=bad)


def test_a_duplicate_parent_id_is_rejected(tiny_llama) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4))
    engine.add_request("p", "ROMEO:", SamplingParams(n=2, max_tokens=3))
    with pytest.raises(ValueError, match="'p' is already"):
        engine.add_request("p", "ROMEO:", SamplingParams(n=2, max_tokens=3))
    engine.run_until_done()
    assert engine.kv_cache_manager.num_used_blocks == 0
