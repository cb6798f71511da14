"""Bad input, faults and load: every bad request gets a clear error, nothing else is disturbed.

Each bad input must raise an error that *names the bad value*; afterwards the engine must still
serve a good request, with exactly the output it would have had anyway, and leak no block. Faults
(a raising subscriber, a forward pass that fails for one step, abort and preemption storms) must
leave every surviving request's output equal to a clean run's.
"""

from __future__ import annotations

import random
import shutil

import pytest
from faults import run_through_faults
from tiny_models import make_model

from nanovllm import LLM, LLMEngine, SamplingParams
from nanovllm.bench.tools.stress import soak
from nanovllm.config import EngineConfig
from nanovllm.models.loader import ModelLoadError

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_llama) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=20, max_model_len=100)
    )


@pytest.fixture(scope="module")
def clean_output(tiny_llama) -> list[int]:
    llm = LLM(str(tiny_llama))
    return llm.generate(["ROMEO:"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def assert_still_serves(engine: LLMEngine, clean_output: list[int]) -> None:
    engine.add_request("good", "ROMEO:", GREEDY)
    final = engine.run_until_done()
    assert final["good"].outputs[0].token_ids == clean_output
    assert engine.kv_cache_manager.num_used_blocks == 0, "a block leaked"
    assert not engine.scheduler.requests


@pytest.mark.quick
@pytest.mark.parametrize(
    "prompt, params, needle",
    [
        ("", GREEDY, "empty"),
        ({"prompt_token_ids": []}, GREEDY, "empty"),
        ({"prompt_token_ids": [5, 99999]}, GREEDY, "99999"),
        ({"prompt_token_ids": [5, -1]}, GREEDY, "-1"),
        ({"prompt_token_ids": [5] * 100}, GREEDY, "max_model_len=100"),
        ({"prompt_token_ids": [5] * 90}, SamplingParams(max_tokens=9), "whole KV cache"),
        ({"prompt_token_ids": [5] * 60}, SamplingParams(max_tokens=39), "whole KV cache"),
        ({"wrong": 1}, GREEDY, "wrong"),
        (12345, GREEDY, "int"),
        ("ok", "not params", "str"),
        ("ok", SamplingParams(logprobs=10**6), "logprobs=1000000"),
    ],
)
def test_bad_request_is_rejected_and_others_keep_running(
    engine, clean_output, prompt, params, needle
) -> None:
    # Another request is in flight while the bad one arrives.
    engine.add_request("bystander", "JULIET:", GREEDY)
    engine.step()
    with pytest.raises(ValueError, match=needle):
        engine.add_request("bad", prompt, params)
    assert "bad" not in engine.scheduler.requests
    done = engine.run_until_done()
    assert done["bystander"].outputs[0].finish_reason == "length"
    assert_still_serves(engine, clean_output)


def test_duplicate_request_id_and_unknown_abort(engine, clean_output) -> None:
    engine.add_request("dup", "ROMEO:", GREEDY)
    with pytest.raises(ValueError, match="'dup'"):
        engine.add_request("dup", "JULIET:", GREEDY)
    with pytest.raises(ValueError, match="'nobody'"):
        engine.abort_request("nobody")
    engine.run_until_done()
    assert_still_serves(engine, clean_output)


@pytest.mark.parametrize(
    "options, needle",
    [
        (dict(block_size=0), "block_size"),
        (dict(num_kv_blocks=0), "num_kv_blocks"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(kv_cache_memory_bytes=16), "too small for a single KV block"),
        (dict(max_model_len=10**6), "max_model_len=1000000"),
        (dict(dtype="float8"), "float8"),
        (dict(attention_backend="cuda"), "cuda"),
        (
            dict(enable_chunked_prefill=False, max_num_batched_tokens=16),
            "max_num_batched_tokens=16",
        ),
    ],
)
def test_bad_engine_options_name_the_value(tiny_llama, options: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        LLMEngine(EngineConfig(model=str(tiny_llama), **options))


def test_bad_checkpoints_name_the_problem(tiny_llama, tmp_path) -> None:
    def copy(name: str):
        dst = tmp_path / name
        shutil.copytree(tiny_llama, dst)
        return dst

    unknown = copy("unknown")
    cfg = (unknown / "config.json").read_text().replace("LlamaForCausalLM", "GPT2LMHeadModel")
    (unknown / "config.json").write_text(cfg)
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel"):
        LLMEngine(EngineConfig(model=str(unknown)))

    missing = copy("missing")
    (missing / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        LLMEngine(EngineConfig(model=str(missing)))

    truncated = copy("truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        LLMEngine(EngineConfig(model=str(truncated)))

    no_tok = copy("no_tokenizer")
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer"):
        LLMEngine(EngineConfig(model=str(no_tok)))

    with pytest.raises(ModelLoadError, match="no/such/folder"):
        LLMEngine(EngineConfig(model="/no/such/folder"))


def test_wrong_tensor_shape_is_named(tmp_path) -> None:
    import json

    path = make_model(tmp_path / "m", hidden_size=32)
    cfg = json.loads((path / "config.json").read_text())
    cfg["intermediate_size"] += 2
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"mlp\.(gate|up|down)_proj\.weight"):
        LLMEngine(EngineConfig(model=str(path)))


# --- faults ---------------------------------------------------------------------------------


def run_batch(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str):
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}{i}", {"prompt_token_ids": p}, params)


@pytest.fixture(scope="module")
def workload(tiny_llama):
    rng = random.Random(7)
    prompts = [[rng.randrange(2, 300) for _ in range(rng.randint(2, 30))] for _ in range(12)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm = LLM(str(tiny_llama))
    clean = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return prompts, params, [o.outputs[0].token_ids for o in clean]


def test_a_raising_subscriber_is_reported_not_raised(tiny_llama, workload) -> None:
    prompts, params, clean = workload
    engine = LLMEngine(EngineConfig(model=str(tiny_llama)))
    seen = []

    def broken(event):
        seen.append(event)
        raise RuntimeError("subscriber bug")

    engine.subscribe(broken)
    run_batch(engine, prompts, params, "r")
    final = engine.run_until_done()
    assert [final[f"r{i}"].outputs[0].token_ids for i in range(len(prompts))] == clean
    assert engine.events.errors and "subscriber bug" in engine.events.errors[0]
    assert len(seen) > len(prompts)


def test_a_forward_pass_that_fails_once_loses_nothing(tiny_llama, workload) -> None:
    prompts, params, clean = workload
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama), block_size=4, num_kv_blocks=40, max_num_batched_tokens=32
        )
    )
    real_execute = engine.runner.execute
    calls = {"n": 0}

    def flaky(out):
        calls["n"] += 1
        if calls["n"] in (3, 7):  # mid-prefill and mid-decode
            raise RuntimeError("injected fault")
        return real_execute(out)

    engine.runner.execute = flaky
    run_batch(engine, prompts, params, "r")
    final, failures = run_through_faults(engine)
    assert failures == 2
    assert [final[f"r{i}"].outputs[0].token_ids for i in range(len(prompts))] == clean
    assert engine.kv_cache_manager.num_used_blocks == 0


def test_abort_storm_and_preemption_storm(tiny_llama, workload) -> None:
    prompts, params, clean = workload
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama), block_size=2, num_kv_blocks=24, max_num_batched_tokens=16
        )
    )
    run_batch(engine, prompts, params, "r")
    rng = random.Random(3)
    victims = set(rng.sample(range(len(prompts)), len(prompts) // 2))
    final, step = {}, 0
    while engine.has_unfinished_requests():
        step += 1
        if step == 4:  # abort half the requests mid-flight
            for i in victims:
                if f"r{i}" in engine.scheduler.requests:
                    engine.abort_request(f"r{i}")
        final.update({o.request_id: o for o in engine.step() if o.finished})
    final.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.scheduler.num_preemptions > 0
    for i in range(len(prompts)):
        out = final[f"r{i}"].outputs[0]
        if out.finish_reason != "abort":
            assert out.token_ids == clean[i]
    assert engine.kv_cache_manager.num_used_blocks == 0
    assert engine.kv_cache_manager.num_free_blocks == 24


def test_scheduler_cost_does_not_grow_with_the_waiting_queue(tiny_llama) -> None:
    """No per-step work proportional to the waiting queue: count prefix-cache lookups."""
    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama), max_num_seqs=4, max_num_batched_tokens=64)
    )
    looked_at = []
    real = engine.kv_cache_manager.get_computed_blocks
    engine.kv_cache_manager.get_computed_blocks = lambda req: (looked_at.append(req), real(req))[1]
    for i in range(10_000):
        engine.add_request(str(i), [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    for _ in range(5):
        looked_at.clear()
        engine.scheduler.schedule()
        assert len(looked_at) <= engine.config.max_num_seqs + 1


def test_short_soak_returns_every_block(tiny_llama) -> None:
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama),
            block_size=4,
            num_kv_blocks=48,
            max_num_seqs=8,
            max_num_batched_tokens=64,
        )
    )
    counts = soak(engine, 150, seed=0, abort_rate=0.2)
    assert sum(counts.values()) == 150
    assert counts.get("abort", 0) > 0
    assert engine.kv_cache_manager.num_free_blocks == 48
    assert not engine.scheduler.requests
    assert not engine.output_processor.has_unfinished_requests()


def test_nan_left_in_stale_slots_never_reaches_an_output(tiny_llama, workload) -> None:
    """Decodes of different lengths are gathered together, padded to the longest: the padding
    and the rest of each last block are stale slots, masked out of the scores. A NaN there must
    still not leak through the values (0 x NaN is NaN)."""
    prompts, params, clean = workload
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, attention_backend="torch"))
    for key_cache, value_cache in engine.runner.kv_caches:
        key_cache.fill_(float("nan"))  # every slot is stale until a step writes it
        value_cache.fill_(float("nan"))
    run_batch(engine, prompts, params, "r")
    final = engine.run_until_done()
    assert [final[f"r{i}"].outputs[0].token_ids for i in range(len(prompts))] == clean


def test_an_abort_output_survives_a_failing_step(tiny_llama) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4))
    engine.add_request("a", "ROMEO:", GREEDY)
    engine.add_request("b", "JULIET:", GREEDY)
    engine.step()
    engine.abort_request("a")
    real_execute = engine.runner.execute

    def failing(out):
        raise RuntimeError("injected fault")

    engine.runner.execute = failing
    with pytest.raises(RuntimeError):
        engine.step()
    engine.runner.execute = real_execute
    outputs = engine.step()
    aborted = [o for o in outputs if o.request_id == "a"]
    assert len(aborted) == 1 and aborted[0].finished
    assert aborted[0].outputs[0].finish_reason == "abort"
    final = engine.run_until_done()
    assert final["b"].finished and engine.kv_cache_manager.num_used_blocks == 0


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use(tiny_llama, caplog) -> None:
    llm = LLM(str(tiny_llama), block_size=4)
    engine = llm.llm_engine
    prompt = {"prompt_token_ids": list(range(2, 30))}
    llm.generate([prompt], GREEDY, use_tqdm=False)
    engine.add_request("running", prompt, GREEDY)
    engine.step()
    assert engine.kv_cache_manager.num_used_blocks > 0
    assert engine.reset_prefix_cache() is False
    assert "in use" in caplog.text
    # The running request's blocks are still hittable, with correct KV: nothing was half-reset.
    engine.run_until_done()
    assert engine.reset_prefix_cache() is True
    assert engine.kv_cache_manager.block_pool.num_cached_free_blocks == 0
    assert not engine.kv_cache_manager.cached_block_hash_to_block
    again = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0, "the reset forgot every prefix"
