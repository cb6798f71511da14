"""The engine on a CUDA GPU: sampling, parity, dtype and memory. Skipped without a GPU.

Run them all, whenever a GPU is at hand, with `python -m pytest -m gpu -q` (`.ci/gpu`).
Oracles: transformers' greedy output in the same dtype, the same seeded request alone and in a
batch, and the device's own memory counters.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams

pytestmark = pytest.mark.gpu

BACKENDS = ["torch", "triton"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("gpu_llama"), vocab_size=512)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_works_on_the_gpu_with_every_filter(model_path, backend: str) -> None:
    llm = LLM(str(model_path), attention_backend=backend, block_size=16, dtype="float32")
    assert llm.llm_engine.runner.device.type == "cuda"
    params = [
        SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=1.0, min_p=0.1, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=1234, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=1e-7, max_tokens=16, ignore_eos=True),
    ]
    prompts = [[5, 17, 42, 9]] * len(params)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 16 for o in outs)
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    seeded_alone = (
        llm.generate([{"prompt_token_ids": prompts[0]}], params[4], use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    assert seeded_alone == outs[4].outputs[0].token_ids
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_matches_transformers_on_the_gpu(model_path, backend: str) -> None:
    prompts = [[5, 17, 42, 9, 100, 3] * k for k in (1, 3, 7)]
    expected = hf_greedy(model_path, prompts, 12)  # float32 on the CPU
    for options in (dict(), dict(block_size=16, num_kv_blocks=4, max_num_batched_tokens=16)):
        llm = LLM(str(model_path), attention_backend=backend, dtype="float32", **options)
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected


def test_auto_dtype_and_the_measured_kv_budget(model_path) -> None:
    llm = LLM(str(model_path), gpu_memory_utilization=0.3, max_num_seqs=4)
    engine = llm.llm_engine
    assert engine.dtype in (torch.bfloat16, torch.float16)
    free, total = torch.cuda.mem_get_info()
    used = torch.cuda.memory_allocated()
    kv_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in engine.runner.kv_caches)
    assert 0 < kv_bytes <= 0.3 * total
    assert used <= 0.3 * total + 2**30
    out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) >= 1


def test_a_steps_inputs_arrive_whole_through_the_pinned_buffer(model_path) -> None:
    """`CudaModelRunner.inputs_on_device` sends a step's tensors in one copy through a pinned buffer
    that the next step rewrites (backends/staging.py). Oracle: each tensor's own `.cpu()` values;
    the first step's device tensors must survive the second step's staging."""
    from decode_steps import decode_step

    llm = LLM(str(model_path), attention_backend="triton", dtype="float32", block_size=16)
    runner = llm.llm_engine.runner
    assert runner.staging.pinned
    steps = [
        (*decode_step([5, 40, 17], 0, 16, 32), [0, 1, 2]),
        (*decode_step([33, 2, 90, 64, 1], 7, 16, 32), [1, 4]),
    ]
    moved = [runner.inputs_on_device(*step) for step in steps]
    torch.cuda.synchronize()
    assert runner.staging.buffer.is_pinned()
    for (ids, pos, meta, rows), (d_ids, d_pos, d_meta, d_rows) in zip(steps, moved):
        assert torch.equal(d_ids.cpu(), ids) and torch.equal(d_pos.cpu(), pos)
        assert d_ids.device.type == "cuda" and d_rows.tolist() == rows
        expected, got = meta.tensors(), d_meta.tensors()
        assert expected.keys() == got.keys()
        for name, tensor in expected.items():
            assert got[name].device.type == "cuda", name
            assert torch.equal(got[name].cpu(), tensor), name
        assert d_meta.seq_lens_list == meta.seq_lens_list  # the lists stay as they were


def test_the_torch_backend_runs_the_plain_runner_on_the_gpu(model_path) -> None:
    """`attention_backend="torch"` is the plain path on every device (issue 43): on a GPU its
    runner is `ModelRunner` itself, not the staging CUDA runner, its KV budget is measured all
    the same, and its greedy tokens are transformers'."""
    from nanovllm.executor.model_runner import ModelRunner

    prompts = [[5, 17, 42, 9, 100, 3] * k for k in (1, 3)]
    llm = LLM(str(model_path), attention_backend="torch", dtype="float32", max_num_seqs=4)
    assert type(llm.llm_engine.runner) is ModelRunner
    assert llm.llm_engine.num_kv_blocks > 0  # measured on the GPU (`backends/gpu_memory.py`)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(model_path, prompts, 12)
