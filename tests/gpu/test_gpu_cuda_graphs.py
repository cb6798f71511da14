"""Decode steps replayed from recorded CUDA graphs against eager steps. Skipped without a GPU.

tests/kernels/test_kernel_decode_graphs.py checks the buffers and padding of `DecodeGraphs` on a
CPU, where nothing is recorded. Here the graphs are recorded (`capture_cuda_graph`), so these
are the checks of the recording: a replay gives the eager forward pass's hidden states and
leaves the KV cache as the eager pass leaves it, on steps of varying sizes; and the engine with
`enforce_eager=False` generates transformers' greedy tokens with its decode steps replayed.
"""

from __future__ import annotations

import logging

import pytest
import torch
from decode_steps import decode_step
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams

pytestmark = pytest.mark.gpu

BLOCK_SIZE = 16
NUM_BLOCKS = 64
MAX_SEQS = 20  # graphs of 1, 2, 4, 8, 16 and 20 rows


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("gpu_graphs"), vocab_size=512)


def triton_llm(model_path, **options) -> LLM:
    """An fp32 engine on the Triton backend, so that eager steps and transformers compare."""
    return LLM(
        str(model_path),
        attention_backend="triton",
        dtype="float32",
        block_size=BLOCK_SIZE,
        **options,
    )


def test_recorded_replays_equal_eager_steps(model_path) -> None:
    llm = triton_llm(model_path, num_kv_blocks=NUM_BLOCKS, max_num_seqs=MAX_SEQS, max_model_len=256)
    runner = llm.llm_engine.runner
    runner.capture_decode_graphs(MAX_SEQS, 256 // BLOCK_SIZE)
    generator = torch.Generator(device="cuda").manual_seed(0)
    for k, v in runner.kv_caches:
        k.normal_(generator=generator)
        v.normal_(generator=generator)
    # Sizes up and down: exact graph sizes, padded ones, a smaller step after a larger one.
    for step, n in enumerate([20, 3, 16, 1, 9, 2, 17]):
        contexts = [(7 * step + 13 * i) % 250 + 1 for i in range(n)]
        input_ids, positions, meta = decode_step(contexts, 5 * step, BLOCK_SIZE, NUM_BLOCKS)
        input_ids, positions, meta, _ = runner.inputs_on_device(input_ids, positions, meta, [])
        eager_caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        with torch.inference_mode():
            expected = runner.model(input_ids, positions, eager_caches, meta)
            assert runner.graphs.can_run(n, meta)
            got = runner.graphs.run(input_ids, positions, meta).clone()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        # The step's own slots as the eager step wrote them (to rounding: a padded batch may
        # take another kernel), every other slot untouched, bit for bit.
        written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool, device="cuda")
        written[meta.slot_mapping] = True
        for (k, v), (k_eager, v_eager) in zip(runner.kv_caches, eager_caches):
            for cache, eager in ((k, k_eager), (v, v_eager)):
                cache, eager = cache.flatten(0, 1), eager.flatten(0, 1)
                torch.testing.assert_close(cache[written], eager[written], rtol=1e-4, atol=1e-4)
                assert torch.equal(cache[~written], eager[~written])
    assert runner.graphs.num_replays == 7


@pytest.mark.parametrize(
    "options",
    [dict(), dict(num_kv_blocks=6, max_num_batched_tokens=32)],  # preemption, chunked prefill
    ids=["plain", "preempting"],
)
def test_greedy_generation_with_graphs_matches_transformers(model_path, options) -> None:
    prompts = [[5, 17, 42, 9, 100, 3] * k for k in (1, 3, 7, 2, 5)]
    lengths = [24, 9, 17, 3, 12]  # batches shrink as requests finish: padded replays
    expected = hf_greedy(model_path, prompts, max(lengths))
    llm = triton_llm(model_path, enforce_eager=False, max_num_seqs=8, **options)
    graphs = llm.llm_engine.runner.graphs
    assert graphs is not None and graphs.batch_sizes == [1, 2, 4, 8]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [e[:n] for e, n in zip(expected, lengths)]
    assert graphs.num_replays > 0
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


def test_no_graphs_by_default_or_with_the_torch_backend(model_path, caplog) -> None:
    assert LLM(str(model_path), attention_backend="triton").llm_engine.runner.graphs is None
    with caplog.at_level(logging.WARNING, logger="nanovllm"):
        llm = LLM(str(model_path), attention_backend="torch", enforce_eager=False)
    assert llm.llm_engine.runner.graphs is None
    assert "no CUDA graphs with attention backend 'torch'" in caplog.text


def test_a_failed_capture_leaves_the_engine_eager(model_path, caplog, monkeypatch) -> None:
    from nanovllm.backends.cuda_runner import CudaModelRunner

    def fail(self, *args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(CudaModelRunner, "capture_decode_graphs", fail)
    with caplog.at_level(logging.WARNING, logger="nanovllm"):
        llm = LLM(str(model_path), attention_backend="triton", enforce_eager=False)
    assert llm.llm_engine.runner.graphs is None
    assert "capturing CUDA graphs failed (RuntimeError" in caplog.text
    out = llm.generate([[5, 17, 42]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_the_graphs_take_no_more_than_the_kv_budget_set_aside(tmp_path) -> None:
    """`measure_kv_budget(graphs=True)` sets aside the peak of an eager forward pass over
    max_num_seqs one-token sequences for the graphs' pool (backends/cuda_runner.py). The oracle is the
    device's own counter: how much reserved memory the capture adds, once eager steps of the
    largest graph's size have already had their own memory."""

    # Wide enough that the pool is tens of MiB, well above the allocator's rounding.
    path = make_model(tmp_path, hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4)
    seqs = 256
    llm = triton_llm(path, num_kv_blocks=NUM_BLOCKS, max_num_seqs=seqs, max_model_len=256)
    runner = llm.llm_engine.runner
    set_aside = runner.peak_memory_of_step(
        seqs, seqs
    )  # (drops the engine's cache: made again below)
    runner.allocate_kv_cache(NUM_BLOCKS)
    contexts = [(13 * i) % 250 + 1 for i in range(seqs)]
    input_ids, positions, meta = decode_step(contexts, 0, BLOCK_SIZE, NUM_BLOCKS)
    runner.forward_logits(input_ids, positions, meta, [])  # eager steps' memory, before capture
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    runner.capture_decode_graphs(seqs, 256 // BLOCK_SIZE)
    torch.cuda.synchronize()
    grown = torch.cuda.memory_reserved() - before
    assert 0 < grown <= set_aside + 4 * 2**20, f"capture took {grown} bytes, {set_aside} set aside"
