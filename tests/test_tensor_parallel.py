"""Tensor parallelism: one model over 2 processes (gloo on this CPU), the same tokens as 1.

Oracles: transformers' greedy output and the single-process engine, on Llama, Qwen2 and Qwen3
checkpoints (including fewer KV heads than ranks), under preemption, chunked prefill and prefix
caching at once; the processes themselves (none left behind, a killed rank named).
Each parallel layer's own property tests (sharded = unsharded) are in tests/distributed/.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from listeners import listening
from tiny_models import hf_greedy, make_draft, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.distributed.worker_group import WorkerDiedError
from nanovllm.events import StepSummary

MODELS = {
    "llama-gqa": dict(arch="llama", num_heads=4, num_kv_heads=2),
    "llama-one-kv-head": dict(arch="llama", num_heads=4, num_kv_heads=1, tie=True),
    "qwen2-bias": dict(arch="qwen2", num_heads=4, num_kv_heads=2),
    "qwen3-qknorm": dict(arch="qwen3", num_heads=4, num_kv_heads=2, head_dim=32),
}
# Preemption (a tiny cache), chunked prefill (a budget under the prompt lengths) and prefix
# caching (shared prefixes) all at once.
TIGHT = dict(block_size=4, num_kv_blocks=14, max_num_batched_tokens=16, max_num_seqs=4)


def prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(2, vocab_size) for _ in range(12)]
    return [
        (shared if i % 2 else [])
        + [rng.randrange(2, vocab_size) for _ in range(rng.randint(3, 20))]
        for i in range(6)
    ]


def no_workers_left() -> bool:
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not multiprocessing.active_children()


@pytest.mark.quick
@pytest.mark.parametrize("name", list(MODELS))
def test_two_ranks_give_the_tokens_of_one_and_of_transformers(tmp_path, name) -> None:
    path = make_model(tmp_path / name, vocab_size=300, **MODELS[name])
    batch = prompts(300)
    expected = hf_greedy(path, batch, 10)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm = LLM(str(path), tensor_parallel_size=2, **TIGHT)
    try:
        events = []
        llm.llm_engine.subscribe(events.append)
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        engine = llm.llm_engine
        assert engine.scheduler.num_preemptions > 0 and engine.scheduler.prefix_cache_hits > 0
        assert engine.kv_cache_manager.num_used_blocks == 0
        summaries = [e for e in events if isinstance(e, StepSummary)]
        assert all(len(s.rank_forward_times) == 2 for s in summaries)
    finally:
        llm.llm_engine.shutdown()
    assert no_workers_left()


def test_a_draft_model_proposes_beside_two_ranks(tmp_path) -> None:
    """Speculative decoding with a draft model (on rank 0 alone) over a 2-rank target: the
    target's tokens, with some proposals accepted, under the tight configuration."""
    path = make_model(tmp_path / "target", vocab_size=300, **MODELS["llama-gqa"])
    draft = make_draft(path, tmp_path / "draft", noise=0.05)
    batch = prompts(300)
    expected = hf_greedy(path, batch, 10)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    spec = {"model": str(draft), "num_speculative_tokens": 3}
    llm = LLM(str(path), tensor_parallel_size=2, speculative_config=spec, **TIGHT)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        stats = llm.llm_engine.stats.spec_decoding
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
        assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0
    finally:
        llm.llm_engine.shutdown()
    assert no_workers_left()


def test_a_size_that_does_not_divide_the_heads_is_refused_before_any_process(tiny_llama) -> None:
    with pytest.raises(
        ValueError, match="tensor_parallel_size=3 does not divide num_attention_heads=4"
    ):
        LLM(str(tiny_llama), tensor_parallel_size=3)
    assert not multiprocessing.active_children()
    with pytest.raises(ValueError, match="tensor_parallel_size must be an int >= 1, got 0"):
        LLM(str(tiny_llama), tensor_parallel_size=0)


def test_a_rank_that_dies_is_named_and_nothing_hangs(tiny_llama) -> None:
    llm = LLM(str(tiny_llama), tensor_parallel_size=2, block_size=4)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    engine.add_request("a", "ROMEO:", params)
    engine.step()
    (worker,) = [p for p in multiprocessing.active_children() if "rank1" in p.name]
    os.kill(worker.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match="rank 1 died") as info:
        while True:
            engine.step()
    assert info.value.rank == 1 and time.monotonic() - start < 60
    with pytest.raises(RuntimeError, match="cannot run any more: tensor-parallel rank 1 died"):
        engine.step()
    engine.shutdown()
    assert no_workers_left()


ENGINES_SIDE_BY_SIDE = """
import sys
from nanovllm import LLM, SamplingParams

params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10, 11]}]
def tokens(llm):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

if __name__ == "__main__":
    before = LLM(sys.argv[1], block_size=4)  # alone, built before the process joins a group
    two = LLM(sys.argv[1], block_size=4, tensor_parallel_size=2)
    after = LLM(sys.argv[1], block_size=4)  # alone, built inside the process's group
    results = [tokens(before), tokens(two), tokens(after)]
    two.llm_engine.shutdown()
    assert results[0] == results[1] == results[2], results
    print("same tokens")
"""


def test_engines_alone_and_parallel_side_by_side_in_one_process(tiny_llama, tmp_path) -> None:
    # The bench compares 2 ranks with 1 in one process. Engines built alone used to call the
    # tensor-parallel group's all-reduces, which no other rank answered: a hang, hence the
    # subprocess and its timeout.
    script = tmp_path / "side_by_side.py"
    script.write_text(ENGINES_SIDE_BY_SIDE)
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_llama)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "same tokens" in done.stdout, done.stderr[-3000:]


UNGUARDED = """
import sys
from nanovllm import LLM
LLM(sys.argv[1], tensor_parallel_size=2)
"""


@pytest.mark.slow
def test_a_script_without_a_main_guard_is_told_so(tiny_llama, tmp_path) -> None:
    """Each spawned rank imports the script again and would start the engine again, which
    multiprocessing refuses (in the rank's stderr only). The error names the missing guard and
    the script; before, it said only "rank 1 died: exited with code 1"."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_llama)], capture_output=True, text=True, timeout=300
    )
    last_line = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1, done.stderr[-3000:]
    assert last_line.startswith("RuntimeError: tensor-parallel rank 1 died"), last_line
    assert f"the script {str(script)!r}" in last_line, last_line
    assert 'without `if __name__ == "__main__":`' in last_line, last_line


def test_an_engine_is_released_at_once_by_del_with_and_shutdown(tiny_llama) -> None:
    """A notebook re-runs its cell: each way of letting an `LLM` go (del, leaving `with`,
    `shutdown()`) releases its worker, its ports and its group at once, so the next
    `LLM(..., tensor_parallel_size=2)` builds in the same process. The collector is off
    throughout: nothing may wait for it (the engine sits in reference cycles)."""
    me = os.getpid()
    ports_before = listening(me)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompt = [{"prompt_token_ids": [5, 6, 7]}]

    def released() -> None:
        assert no_workers_left()
        assert listening(me) == ports_before

    gc.disable()
    try:
        llm = LLM(str(tiny_llama), tensor_parallel_size=2)
        expected = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
        del llm
        released()
        with LLM(str(tiny_llama), tensor_parallel_size=2) as llm:
            assert llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids == expected
        released()
        llm = LLM(str(tiny_llama), tensor_parallel_size=2)
        llm.shutdown()
        released()
        llm.shutdown()  # twice is harmless
        with pytest.raises(RuntimeError, match="closed"):
            llm.generate(prompt, params, use_tqdm=False)
    finally:
        gc.enable()
