"""Mixtral and Qwen3-MoE: greedy output equals transformers' `generate`, as in test_parity.py.

Tiny random checkpoints (every parameter random, the routers' included) run through the engine
under the scheduling configurations test_parity.py draws (block sizes, preemption, chunked
prefill, prefix caching), with the default CPU backend (its MoE fast path, `cpu_moe.py`) and the
plain one (`attention_backend="torch"`), and with two tensor-parallel ranks. Qwen3-MoE's has 8
experts, no renormalisation of the top-k weights, and a dense layer (`mlp_only_layers`); a
Mixtral with a sliding window runs on the torch backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from budget import examples
from hypothesis import given, settings
from test_parity import MAX_TOKENS, engine_configs, make_prompts, run_nanovllm
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams

MODELS = {
    "mixtral": dict(arch="mixtral", num_heads=4, num_kv_heads=2),
    "qwen3-moe": dict(
        arch="qwen3_moe",
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        moe=dict(num_experts=8, norm_topk_prob=False, mlp_only_layers=[1]),
    ),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, list[list[int]], list[list[int]]]]:
    built = {}
    for name, options in MODELS.items():
        path = make_model(tmp_path_factory.mktemp(name), vocab_size=512, **options)
        prompts = make_prompts(512)
        built[name] = (path, prompts, hf_greedy(path, prompts, MAX_TOKENS))
    return built


@pytest.mark.parametrize("backend", [None, "torch"])
@pytest.mark.parametrize("name", list(MODELS))
@settings(max_examples=examples(6), deadline=None)
@given(config=engine_configs)
def test_greedy_matches_transformers(checkpoints, name: str, backend, config: dict) -> None:
    path, prompts, expected = checkpoints[name]
    config = dict(config)
    kv_slots = config.pop("kv_slots")
    config["num_kv_blocks"] = max(kv_slots // config["block_size"], 1)
    options = {} if backend is None else {"attention_backend": backend}
    assert run_nanovllm(path, prompts, **config, **options) == expected


@pytest.mark.parametrize("expert_parallel", [False, True])
@pytest.mark.parametrize("name", list(MODELS))
def test_two_tensor_parallel_ranks_match_transformers(
    checkpoints, name: str, expert_parallel: bool
) -> None:
    """Each rank holds half of every expert's intermediate features, or (expert parallel) half
    of the experts whole; under preemption, chunked prefill and prefix caching at once."""
    path, prompts, expected = checkpoints[name]
    llm = LLM(
        str(path),
        tensor_parallel_size=2,
        enable_expert_parallel=expert_parallel,
        block_size=4,
        num_kv_blocks=24,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        enable_prefix_caching=True,
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        assert llm.llm_engine.scheduler.num_preemptions > 0
    finally:
        llm.llm_engine.shutdown()


def test_the_default_cpu_backend_runs_the_moe_fast_path(checkpoints) -> None:
    """So the default backend's parity above is the fast path's (`backends/cpu_moe.py`)."""
    from nanovllm.backends.cpu_moe import CpuSparseMoeBlock
    from nanovllm.models.moe import SparseMoeBlock

    path, _, _ = checkpoints["mixtral"]
    for backend, expected in (("cpu", CpuSparseMoeBlock), ("torch", SparseMoeBlock)):
        llm = LLM(str(path), attention_backend=backend)
        assert type(llm.llm_engine.runner.model.model.layers[0].mlp) is expected


def test_a_sliding_window_mixtral_matches_transformers(tmp_path) -> None:
    """Mixtral's `sliding_window` (every layer slides), on the torch backend (the CPU kernel
    has no windows yet); prompts and outputs run past the window of 8."""
    path = make_model(tmp_path, arch="mixtral", vocab_size=512, moe=dict(sliding_window=8))
    prompts = make_prompts(512)
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    got = run_nanovllm(path, prompts, attention_backend="torch", block_size=4, num_kv_blocks=64)
    assert got == expected


def test_expert_parallel_on_a_dense_model_is_refused_by_name(tmp_path) -> None:
    path = make_model(tmp_path, arch="llama", vocab_size=256)
    with pytest.raises(ValueError, match="LlamaForCausalLM has no mixture of experts"):
        LLM(str(path), enable_expert_parallel=True)
