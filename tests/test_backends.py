"""Every backend against the plain path it replaces (`nanovllm/backends/`).

Oracles: transformers' greedy `generate` on the same random-weight checkpoint (every parameter
random, norms and biases included), and the plain "torch" backend's own logprobs; for the
plain backend itself, what a fresh process has imported and which torch ops it ran.
The parts have their own tests against their plain versions too: the numba norms and RoPE
(tests/kernels/test_kernel_cpu_token_ops.py), the packed matmuls (test_cpu_linear.py), the
persistent batch (test_input_batch.py), the staging (test_staging.py), the compiled layers
(test_compile.py), the CUDA graphs (tests/kernels/test_kernel_decode_graphs.py), the kernels
(tests/kernels/).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.backends import BACKENDS, get_backend, pick_backend
from nanovllm.backends.cpu import NumbaRMSNorm, NumbaRotaryEmbedding
from nanovllm.backends.cpu_linear import PackedMatmul
from nanovllm.kernels.cpu_paged_attention import cpu_fast_path_available

MAX_TOKENS = 8
MODELS = {
    "llama": dict(arch="llama", num_heads=4, num_kv_heads=2),
    "qwen2": dict(arch="qwen2", num_heads=4, num_kv_heads=2),  # q/k/v biases
    "qwen3": dict(arch="qwen3", num_heads=4, num_kv_heads=1, head_dim=32, tie=True),  # q/k norms
}


class Checkpoints(dict):
    """Per model: its folder, prompts (half share a prefix) and transformers' greedy tokens."""

    def __init__(self, tmp_path_factory) -> None:
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name: str):
        path = make_model(self.tmp_path_factory.mktemp(name), vocab_size=256, **MODELS[name])
        rng = random.Random(1)
        shared = [rng.randrange(2, 256) for _ in range(9)]
        prompts = [
            (shared if i % 2 else []) + [rng.randrange(2, 256) for _ in range(rng.randint(1, 20))]
            for i in range(5)
        ]
        self[name] = (path, prompts, hf_greedy(path, prompts, MAX_TOKENS))
        return self[name]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory)


def generate(path: Path, prompts, **options):
    llm = LLM(str(path), **options)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0
    return llm, [o.outputs[0] for o in outs]


@pytest.mark.skipif(not cpu_fast_path_available(), reason="numba is not installed")
@pytest.mark.parametrize("name", list(MODELS))
@settings(max_examples=examples(4), deadline=None)
@given(
    config=st.fixed_dictionaries(
        {
            "block_size": st.sampled_from([1, 4, 16]),
            "num_kv_blocks": st.sampled_from([24, 400]),  # (24 x 1 slots: preemption)
            "max_num_batched_tokens": st.sampled_from([7, 2048]),
            "max_num_seqs": st.sampled_from([2, 8]),
            "enable_prefix_caching": st.booleans(),
        }
    )
)
def test_the_cpu_backend_gives_the_plain_paths_tokens(checkpoints, name, config) -> None:
    """Numba attention, norms and RoPE, packed matmuls and the persistent batch, under every
    scheduling configuration: transformers' greedy tokens, and the plain backend's logprobs."""
    if config["num_kv_blocks"] * config["block_size"] < 60:
        config["num_kv_blocks"] = -(-60 // config["block_size"])  # room for the longest request
    path, prompts, expected = checkpoints[name]
    fast_llm, fast = generate(path, prompts, attention_backend="cpu", **config)
    plain_llm, plain = generate(path, prompts, attention_backend="torch", **config)
    assert [o.token_ids for o in fast] == [o.token_ids for o in plain] == expected
    for a, b in zip(fast, plain):
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            assert la.keys() == lb.keys()
            for token in la:
                assert la[token].logprob == pytest.approx(lb[token].logprob, abs=1e-4)
    # Each engine ran what its backend says: the fast classes in one, none in the other.
    fast_types = {type(m) for m in fast_llm.llm_engine.runner.model.modules()}
    plain_types = {type(m) for m in plain_llm.llm_engine.runner.model.modules()}
    assert {NumbaRMSNorm, NumbaRotaryEmbedding} <= fast_types
    packed = [m for m in fast_llm.llm_engine.runner.model.modules() if isinstance(m, PackedMatmul)]
    assert packed and all(m.packed_weight is not None for m in packed)  # built, then packed
    assert not any(t.__module__.startswith("nanovllm.backends") for t in plain_types)


PLAIN_RUN = """
import json, sys, torch
from nanovllm import LLM, SamplingParams
llm = LLM(sys.argv[1], attention_backend="torch")
params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
out = llm.generate([{"prompt_token_ids": [5, 17, 3, 99, 42]}], params, use_tqdm=False)
# (Before the profiler, which imports torch._dynamo, which imports triton where it is.)
modules = sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "triton", "llvmlite")
                 or m.startswith(("nanovllm.kernels", "nanovllm.backends.")))
with torch.profiler.profile() as prof:
    llm.generate([{"prompt_token_ids": [5, 17, 3, 99, 42]}], params, use_tqdm=False)
ops = sorted({e.name for e in prof.events()})
classes = sorted({type(m).__module__ for m in llm.llm_engine.runner.model.modules()})
print(json.dumps({"tokens": out[0].outputs[0].token_ids, "ops": ops, "modules": modules,
                  "classes": classes, "runner": type(llm.llm_engine.runner).__module__}))
"""


def test_the_torch_backend_is_plain_pytorch_throughout(tiny_llama, tmp_path) -> None:
    """In a fresh process (run from an empty folder, so that nothing but the installed package
    is importable): no numba, Triton or kernel module imported, no packed matmul run,
    only the plain classes in the model, and the default backend's tokens."""
    result = subprocess.run(
        [sys.executable, "-c", PLAIN_RUN, str(tiny_llama)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["modules"] == []
    assert not [op for op in seen["ops"] if "mkl" in op or "packed" in op]  # MKL's and oneDNN's
    assert "aten::linear" in seen["ops"]  # (the profile does see the matmuls)
    assert all(m.startswith(("nanovllm.models", "torch")) for m in seen["classes"])
    assert seen["runner"] == "nanovllm.executor.model_runner"
    llm = LLM(str(tiny_llama))  # the default: the fastest backend here
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": [5, 17, 3, 99, 42]}], params, use_tqdm=False)
    assert out[0].outputs[0].token_ids == seen["tokens"]


def test_backends_are_chosen_by_name_and_a_bad_name_is_named() -> None:
    import torch

    assert set(BACKENDS) == {"torch", "cpu", "triton"}
    assert pick_backend("torch", torch.device("cpu")) == "torch"
    assert get_backend("torch").name == "torch"
    with pytest.raises(ValueError, match="'cuda-graphs'"):
        get_backend("cuda-graphs")
    with pytest.raises(ValueError, match="attention_backend='cpu' runs on a CPU"):
        pick_backend("cpu", torch.device("cuda"))
    if cpu_fast_path_available():
        assert pick_backend(None, torch.device("cpu")) == "cpu"
    assert pick_backend(None, torch.device("cpu"), torch.bfloat16) == "torch"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_plain_backend_runs_the_plain_runner_on_every_device(device: str) -> None:
    """`"torch"` is the plain path everywhere (issue 43): its runner class is `ModelRunner` on a
    GPU too (no staging, no persistent batch); the GPU's runner is the Triton backend's. (The
    choice alone, without a GPU: tests/gpu/ builds the engine on one.)"""
    from nanovllm.backends.cuda_runner import CudaModelRunner
    from nanovllm.executor.model_runner import ModelRunner

    assert get_backend("torch").runner_class(torch.device(device)) is ModelRunner
    if device == "cuda":
        assert get_backend("triton").runner_class(torch.device(device)) is CudaModelRunner
