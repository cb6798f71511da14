"""Async scheduling (`async_scheduling=True`, `engine/async_step.py`) changes when the engine does
its work, never what it produces.

Oracles: transformers' greedy `generate` and the plain (synchronous) engine on the same
checkpoint. Greedy tokens must be equal under preemption (a tiny KV budget), chunked prefill,
prefix caching, n > 1 and a stop string; no block may stay in use after the run; and every
request's own events (scheduled, tokens, blocks, finished) must be the plain loop's, in the same
order: the step scheduled for a request after the step it stopped in leaves no trace.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from pathlib import Path

import pytest
from budget import examples
from faults import run_through_faults
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.config import EngineConfig
from nanovllm.events import (
    BlockAllocated,
    BlockCached,
    BlockFreed,
    CacheHit,
    RequestFinished,
    RequestPreempted,
    RequestScheduled,
    TokenEmitted,
)

MAX_TOKENS = 10
VOCAB = 512


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, list[list[int]], list[list[int]]]:
    """A tiny Llama, prompts (half share a 12-token prefix) and transformers' greedy outputs."""
    path = make_model(tmp_path_factory.mktemp("async"), vocab_size=VOCAB, seed=3)
    rng = random.Random(0)
    shared = [rng.randrange(2, VOCAB) for _ in range(12)]
    prompts = []
    for i in range(6):
        tail = [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 20))]
        prompts.append(shared + tail if i % 2 else tail)
    return path, prompts, hf_greedy(path, prompts, MAX_TOKENS)


def run(path: Path, prompts, params: SamplingParams | None = None, **options):
    """The outputs and each request's events; checks that no block is in use afterwards."""
    llm = LLM(str(path), **options)
    engine = llm.llm_engine
    events = []
    engine.subscribe(events.append)
    params = params or SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert engine.kv_cache_manager.num_used_blocks == 0, "blocks leaked after the run"
    assert not getattr(engine.scheduler, "num_output_placeholders", {}), "placeholders left"
    return outs, events, engine


def per_request(events) -> dict[str, list[tuple]]:
    """Each request's events in order, without block ids (which blocks are handed out may
    differ: the async loop schedules a step before the blocks of the one before are freed)."""
    kinds = (RequestScheduled, TokenEmitted, RequestFinished, RequestPreempted, BlockCached)
    seen: dict[str, list[tuple]] = defaultdict(list)
    for e in events:
        if isinstance(e, kinds):
            fields = {k: v for k, v in vars(e).items() if k != "block_id"}
            seen[e.request_id].append((type(e).__name__, tuple(sorted(fields.items()))))
        elif isinstance(e, BlockAllocated | CacheHit | BlockFreed):
            seen[e.request_id].append((type(e).__name__,))
    return dict(seen)


def check_block_history(events) -> None:
    """Replayed in order, the events never give a block to a finished request, never free a
    block a request does not hold, and leave no request holding a block."""
    held: dict[str, list[int]] = defaultdict(list)
    finished: set[str] = set()
    for e in events:
        rid = getattr(e, "request_id", None)
        if isinstance(e, BlockAllocated | CacheHit):
            assert rid not in finished, f"{e} after {rid} finished"
            held[rid].append(e.block_id)
        elif isinstance(e, BlockFreed):
            assert e.block_id in held[rid], f"{e}: {rid} does not hold it"
            held[rid].remove(e.block_id)
        elif isinstance(e, RequestFinished):
            finished.add(rid)
        elif isinstance(e, RequestScheduled | TokenEmitted):
            assert rid not in finished, f"{e} after {rid} finished"
    assert not any(held.values()), f"blocks still held in the event history: {dict(held)}"


CONFIGS = {
    "default": dict(),
    "preemption": dict(block_size=4, num_kv_blocks=12, max_num_batched_tokens=16),
    "chunked-prefill": dict(block_size=4, max_num_batched_tokens=7),
    "prefix-caching": dict(block_size=4, max_num_seqs=2),
    "no-prefix-caching-one-seat": dict(block_size=3, max_num_seqs=1, enable_prefix_caching=False),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_output_is_unchanged(checkpoint, name: str) -> None:
    path, prompts, expected = checkpoint
    sync_outs, sync_events, sync_engine = run(path, prompts, **CONFIGS[name])
    outs, events, engine = run(path, prompts, async_scheduling=True, **CONFIGS[name])
    assert [o.outputs[0].token_ids for o in sync_outs] == expected
    assert [o.outputs[0].token_ids for o in outs] == expected
    check_block_history(events)
    if name == "preemption":  # the configuration does what it says, in both loops
        assert sync_engine.scheduler.num_preemptions > 0 and engine.scheduler.num_preemptions > 0
    if name == "prefix-caching":
        assert engine.scheduler.prefix_cache_hits > 0


@pytest.mark.quick
@pytest.mark.parametrize("name, max_tokens", [("default", MAX_TOKENS), ("chunked-prefill", 40)])
def test_each_requests_events_are_the_plain_loops(checkpoint, name: str, max_tokens: int) -> None:
    """While no request stops before every prompt is in (then the step after a request's last
    one takes no budget another would have had), both loops run the same steps: each request's
    events must be equal, step numbers included. The step scheduled after a request's last one
    must leave no trace (no event, no token, no block)."""
    path, prompts, _ = checkpoint
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    _, sync_events, _ = run(path, prompts, params, **CONFIGS[name])
    outs, events, _ = run(path, prompts, params, async_scheduling=True, **CONFIGS[name])
    assert per_request(events) == per_request(sync_events)
    check_block_history(events)
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)


def test_n_greater_than_one_and_a_stop_string(checkpoint) -> None:
    path, prompts, _ = checkpoint
    plain, _, _ = run(path, prompts[:3])
    # A stop string from the middle of the first request's text: it stops early.
    text = plain[0].outputs[0].text
    stop = re.search(r"[A-Za-z0-9 ]{2}", text[2:]).group()
    for params in (
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, n=2),
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop]),
        # (penalties read the output so far: sampling step N+1 must see step N's token)
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, presence_penalty=2),
    ):
        sync_outs, sync_events, _ = run(path, prompts[:3], params, block_size=4)
        outs, events, _ = run(path, prompts[:3], params, block_size=4, async_scheduling=True)
        got = [[(c.token_ids, c.text, c.finish_reason) for c in o.outputs] for o in outs]
        want = [[(c.token_ids, c.text, c.finish_reason) for c in o.outputs] for o in sync_outs]
        assert got == want
        assert per_request(events) == per_request(sync_events)
        if params.stop:
            assert outs[0].outputs[0].finish_reason == "stop"


@settings(max_examples=examples(4), deadline=None)
@given(
    max_tokens=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    block_size=st.sampled_from([1, 4, 16]),
    kv_slots=st.sampled_from([48, 4096]),  # 48 slots preempt
    max_num_batched_tokens=st.sampled_from([5, 64]),
    seed=st.integers(0, 2**16),
)
def test_random_workloads_match_the_plain_loop(
    checkpoint, max_tokens, block_size, kv_slots, max_num_batched_tokens, seed
) -> None:
    """Requests stopping at different steps (each its own max_tokens): the same tokens as the
    plain loop, and a block history that frees everything."""
    path, _, _ = checkpoint
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 24))] for _ in max_tokens]
    options = dict(
        block_size=block_size,
        num_kv_blocks=max(kv_slots // block_size, 1),
        max_num_batched_tokens=max_num_batched_tokens,
    )
    results = []
    for async_scheduling in (False, True):
        llm = LLM(str(path), async_scheduling=async_scheduling, **options)
        engine = llm.llm_engine
        events = []
        engine.subscribe(events.append)
        for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
            params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
            engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
        final = engine.run_until_done()
        assert engine.kv_cache_manager.num_used_blocks == 0
        check_block_history(events)
        results.append({rid: o.outputs[0].token_ids for rid, o in final.items()})
    assert results[0] == results[1]
    assert all(len(results[1][str(i)]) == n for i, n in enumerate(max_tokens))


def test_an_abort_between_steps_frees_everything(checkpoint) -> None:
    path, prompts, _ = checkpoint
    llm = LLM(str(path), async_scheduling=True, block_size=4)
    engine = llm.llm_engine
    events = []
    engine.subscribe(events.append)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts[:3]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    for _ in range(3):
        engine.step()
    engine.abort_request("1")  # while a step that includes it is in flight
    final = engine.run_until_done()
    assert final["1"].outputs[0].finish_reason == "abort"
    assert len(final["0"].outputs[0].token_ids) == MAX_TOKENS
    assert engine.kv_cache_manager.num_used_blocks == 0
    check_block_history(events)


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}), "speculative"),
        (dict(tensor_parallel_size=2), "tensor_parallel_size"),
    ],
)
def test_combinations_it_cannot_run_are_refused(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"async_scheduling=True does not support {named}"):
        EngineConfig(async_scheduling=True, **options)
    EngineConfig(**options)  # (fine without it)


def test_the_cli_flag_reaches_the_engine_config() -> None:
    import argparse

    from nanovllm.engine.generate_cli import add_engine_arguments, engine_options

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_options(parser.parse_args(["--async-scheduling"]))["async_scheduling"] is True
    assert engine_options(parser.parse_args([]))["async_scheduling"] is False


def test_a_grammar_in_the_batch_gives_the_plain_loops_tokens(checkpoint) -> None:
    """A grammar masks each step by the token before it, which a step scheduled ahead does not
    have yet: the loop stops scheduling ahead while such a request runs. Seeded sampling, so a
    wrong mask (or a token drawn from the wrong step) shows."""
    from nanovllm import StructuredOutputsParams

    path, prompts, _ = checkpoint
    constrained = SamplingParams(
        temperature=1.0, max_tokens=12, seed=3,
        structured_outputs=StructuredOutputsParams(regex="[a-c]{3,8}"),
    )  # fmt: skip
    free = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    texts = []
    for async_scheduling in (False, True):
        llm = LLM(str(path), async_scheduling=async_scheduling, block_size=4)
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts[:4]],
            [free, constrained, free, constrained],
            use_tqdm=False,
        )
        assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0
        texts.append([(o.outputs[0].token_ids, o.outputs[0].text) for o in outs])
    assert texts[0] == texts[1]
    assert all(re.fullmatch("[a-c]{3,8}", texts[1][i][1]) for i in (1, 3))


def test_a_forward_pass_that_fails_undoes_both_steps_in_flight_and_loses_nothing(
    checkpoint,
) -> None:
    """The step after a failed one was scheduled on its tokens: both are rolled back (their
    requests recompute), the error reaches the caller, and the run then ends as without it."""
    from nanovllm.engine.llm_engine import LLMEngine

    path, prompts, expected = checkpoint
    engine = LLMEngine(EngineConfig(model=str(path), async_scheduling=True, block_size=4))
    real = engine.runner.forward_logits
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] in (2, 6):  # mid-prefill and mid-decode
            raise RuntimeError("injected fault")
        return real(*args)

    engine.runner.forward_logits = flaky
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    final, failures = run_through_faults(engine)
    assert failures == 2
    assert [final[str(i)].outputs[0].token_ids for i in range(len(prompts))] == expected
    assert engine.kv_cache_manager.num_used_blocks == 0  # (the undone steps' blocks too)
    assert engine.kv_cache_manager.num_used_blocks == 0
    assert not engine.scheduler.num_output_placeholders


def test_sampling_waits_for_the_outputs_of_the_step_before(checkpoint) -> None:
    """Penalties read a request's output so far, so step N+1 samples only once step N's token
    is appended. Outputs made slowly (a sleep before the append) leave the worker time to
    sample too early, if it did not wait."""
    import time

    path, prompts, _ = checkpoint
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, presence_penalty=2)
    plain, _, _ = run(path, prompts[:2], params)
    llm = LLM(str(path), async_scheduling=True)
    scheduler = llm.llm_engine.scheduler
    append = scheduler.update_from_output

    def slow(*args):
        time.sleep(0.02)
        return append(*args)

    scheduler.update_from_output = slow
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
