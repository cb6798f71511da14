"""The engine's correctness oracle: greedy output equals transformers' `generate`.

For random-weight Llama, Qwen2 and Qwen3 checkpoints of several shapes (GQA ratios, head dims,
tied embeddings, sharded weights) and for the embedded model, nanovllm's greedy token ids must
equal Hugging Face transformers' `generate(do_sample=False)`, token for token, under every
scheduling configuration hypothesis draws: block sizes (1, and sizes that do not divide the
prompts), KV budgets small enough to force preemption, chunked-prefill budgets smaller than the
prompts, prefix caching on (with shared prefixes) and off.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.engine.setup import default_model_path

MAX_TOKENS = 12

MODELS = {
    "llama-gqa2": dict(arch="llama", num_heads=4, num_kv_heads=2),
    "llama-mha-tied": dict(arch="llama", num_heads=4, num_kv_heads=4, tie=True, shards=True),
    "llama3-rope-scaling": dict(
        arch="llama",
        num_heads=4,
        num_kv_heads=1,
        hidden_size=64,
        head_dim=32,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2-bias": dict(arch="qwen2", num_heads=4, num_kv_heads=2),
    "qwen3-qknorm-hd32": dict(arch="qwen3", num_heads=4, num_kv_heads=2, head_dim=32, tie=True),
}


def make_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Mixed lengths, with a shared 20-token prefix on half of them (for prefix caching)."""
    rng = random.Random(seed)
    shared = [rng.randrange(2, vocab_size) for _ in range(20)]
    prompts = []
    for i in range(6):
        tail = [rng.randrange(2, vocab_size) for _ in range(rng.randint(1, 30))]
        prompts.append(shared + tail if i % 2 else tail)
    return prompts


class Checkpoints(dict):
    """Each tiny model with its prompts and transformers' greedy outputs, built on first use."""

    def __init__(self, tmp_path_factory) -> None:
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name: str) -> tuple[Path, list[list[int]], list[list[int]]]:
        path = make_model(self.tmp_path_factory.mktemp(name), vocab_size=512, **MODELS[name])
        prompts = make_prompts(512)
        self[name] = (path, prompts, hf_greedy(path, prompts, MAX_TOKENS))
        return self[name]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory)


def run_nanovllm(path: Path, prompts: list[list[int]], **options) -> list[list[int]]:
    llm = LLM(str(path), **options)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    engine = llm.llm_engine
    assert engine.kv_cache_manager.num_used_blocks == 0, "blocks leaked after the run"
    return [o.outputs[0].token_ids for o in outs]


engine_configs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 3, 4, 16]),
        "kv_slots": st.sampled_from([64, 96, 4096]),  # 64 slots forces preemption
        "max_num_batched_tokens": st.sampled_from([5, 17, 64, 2048]),
        "max_num_seqs": st.sampled_from([1, 3, 8]),
        "enable_prefix_caching": st.booleans(),
    }
)


# The quick tier's parity: one configuration per architecture.
QUICK_MODELS = ("llama-gqa2", "qwen2-bias", "qwen3-qknorm-hd32")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.quick) if n in QUICK_MODELS else n for n in MODELS]
)
@settings(max_examples=examples(6), deadline=None)
@given(config=engine_configs)
def test_greedy_matches_transformers(checkpoints, name: str, config: dict) -> None:
    path, prompts, expected = checkpoints[name]
    kv_slots = config.pop("kv_slots")
    config["num_kv_blocks"] = max(kv_slots // config["block_size"], 1)
    got = run_nanovllm(path, prompts, **config)
    assert got == expected


def test_a_tiny_kv_budget_really_preempts(checkpoints) -> None:
    path, prompts, expected = checkpoints["llama-gqa2"]
    llm = LLM(str(path), block_size=4, num_kv_blocks=16, max_num_batched_tokens=32)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_prefix_caching_hits_and_still_matches(checkpoints) -> None:
    path, prompts, expected = checkpoints["qwen2-bias"]
    llm = LLM(str(path), block_size=4, max_num_seqs=1)  # one at a time: later ones hit the cache
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.llm_engine.scheduler.prefix_cache_hits > 0
    assert any(o.num_cached_tokens > 0 for o in outs)
    assert [o.outputs[0].token_ids for o in outs] == expected


@pytest.mark.skipif(
    not (default_model_path() / "model.safetensors").is_file(), reason="embedded model not built"
)
def test_embedded_model_matches_transformers() -> None:
    from transformers import AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(str(path))
    texts = ["ROMEO:\nBut soft, what light", "KING HENRY:\n", "To be, or not to be"]
    prompts = [tok.encode(t) for t in texts]
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    for options in (dict(), dict(block_size=4, num_kv_blocks=20, max_num_batched_tokens=8)):
        assert run_nanovllm(path, prompts, **options) == expected


def same_step_sharing(events: list) -> int:
    """How many prefix-cache hits were on a block that another request registered in the same
    step (so its KV is written by the very forward pass that reads it)."""
    from nanovllm.events import BlockCached, CacheHit, StepSummary

    hits, cached_this_step = 0, {}
    for event in events:
        if isinstance(event, StepSummary):
            cached_this_step = {}
        elif isinstance(event, BlockCached):
            cached_this_step[event.block_id] = event.request_id
        elif isinstance(event, CacheHit):
            owner = cached_this_step.get(event.block_id)
            hits += owner is not None and owner != event.request_id
    return hits


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_requests_sharing_a_prefix_in_the_same_step_match_transformers(
    checkpoints, name: str, backend: str
) -> None:
    """The second request of a step reads blocks the first one writes in that step's forward
    pass: the cache must hold them before any attention reads it. Both CPU attention backends:
    the readable torch one and the in-place kernel (the default)."""
    path, _, _ = checkpoints[name]
    block_size = 3 + list(MODELS).index(name) % 2  # 3 (not dividing the prefix) or 4
    rng = random.Random(block_size)
    shared = [rng.randrange(2, 512) for _ in range(14)]
    prompts = [shared + [rng.randrange(2, 512) for _ in range(n)] for n in (3, 1, 6, 2)]
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    llm = LLM(
        str(path),
        block_size=block_size,
        max_num_seqs=8,
        enable_prefix_caching=True,
        attention_backend=backend,
    )
    events = []
    llm.llm_engine.subscribe(events.append)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert same_step_sharing(events) >= 3 * (len(shared) // block_size), "no same-step sharing"
    assert [o.outputs[0].token_ids for o in outs] == expected
