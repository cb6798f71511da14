"""Decode steps through `DecodeGraphs` (backends/cuda_graphs.py), on a CPU.

Without a GPU there is no graph to record, so these tests capture with `capture_eagerly`: a
"replay" runs the same forward again over the same static buffers. What they check is all of
`DecodeGraphs` but the recording: the copies into the static buffers, the padding rows, the
choice of graph, and the Triton kernels' handling of padding (slot -1). The kernels run through
Triton's interpreter here, so the shapes are tiny. The recorded graphs are checked against eager
steps by tests/gpu/test_gpu_cuda_graphs.py, on a GPU.

Oracles: the eager model on the same inputs (hidden states, and the KV cache it leaves), and
transformers' greedy generation.
"""

from __future__ import annotations

import pytest
import torch
from budget import examples
from decode_steps import decode_step
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tiny_models import hf_greedy

from nanovllm import LLM, SamplingParams
from nanovllm.backends.cuda_graphs import capture_eagerly, graph_batch_sizes
from nanovllm.kernels.triton_setup import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

BLOCK_SIZE = 4
NUM_BLOCKS = 24
MAX_SEQS = 4
MAX_BLOCKS_PER_SEQ = 6


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    llm = LLM(
        str(tiny_llama),
        attention_backend="triton",
        block_size=BLOCK_SIZE,
        num_kv_blocks=NUM_BLOCKS,
        max_num_seqs=MAX_SEQS,
        max_model_len=MAX_BLOCKS_PER_SEQ * BLOCK_SIZE,
    )
    llm.llm_engine.runner.capture_decode_graphs(MAX_SEQS, MAX_BLOCKS_PER_SEQ, capture_eagerly)
    return llm


def test_batch_sizes() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]


@settings(max_examples=examples(8), deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(
                st.integers(1, MAX_BLOCKS_PER_SEQ * BLOCK_SIZE), min_size=1, max_size=MAX_SEQS
            ),
            st.integers(0, NUM_BLOCKS - 1),
        ),
        min_size=2,
        max_size=3,
    ),
)
# Always: a step of 3 after a step of 4 (the graph of 4 rows, its last row padding over the
# slot the earlier step wrote), then a step of 1.
@example(steps=[([5, 9, 2, 17], 0), ([3, 8, 11], 7), ([6], 3)])
def test_a_replay_equals_the_eager_step_and_writes_only_its_own_slots(llm, steps) -> None:
    """Steps of varying sizes in a row (a smaller step after a larger one leaves stale slots in
    the static buffers): each gives the eager model's hidden states and writes only the slots
    the eager step writes, with its values."""
    runner = llm.llm_engine.runner
    graphs = runner.graphs
    generator = torch.Generator().manual_seed(len(steps))
    for k, v in runner.kv_caches:  # a cache full of other requests' K/V
        k.copy_(torch.randn(k.shape, generator=generator))
        v.copy_(torch.randn(v.shape, generator=generator))
    for contexts, first_block in steps:
        input_ids, positions, meta = decode_step(contexts, first_block, BLOCK_SIZE, NUM_BLOCKS)
        before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        with torch.inference_mode():
            expected = runner.model(input_ids, positions, before, meta)
            assert graphs.can_run(len(contexts), meta)
            got = graphs.run(input_ids, positions, meta)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        # The step's own slots hold what the eager step wrote (to rounding: a graph's padded
        # batch may sum in another order); every other slot is untouched, bit for bit.
        written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
        written[meta.slot_mapping] = True
        for cache, eager in zip(
            (t for kv in runner.kv_caches for t in kv), (t for kv in before for t in kv)
        ):
            cache, eager = cache.flatten(0, 1), eager.flatten(0, 1)  # [slots, heads, head_dim]
            torch.testing.assert_close(cache[written], eager[written], rtol=1e-5, atol=1e-5)
            assert torch.equal(cache[~written], eager[~written])


def test_steps_the_graphs_cannot_hold_run_eagerly(llm) -> None:
    graphs = llm.llm_engine.runner.graphs
    _, _, meta = decode_step([3, 5], 0, BLOCK_SIZE, NUM_BLOCKS)
    assert not graphs.can_run(3, meta)  # a prefill token among them
    _, _, wide = decode_step([MAX_BLOCKS_PER_SEQ * BLOCK_SIZE + 1], 0, BLOCK_SIZE, NUM_BLOCKS)
    assert not graphs.can_run(1, wide)  # a table wider than the graphs' buffer
    _, _, many = decode_step([1] * (MAX_SEQS + 1), 0, BLOCK_SIZE, NUM_BLOCKS)
    assert not graphs.can_run(MAX_SEQS + 1, many)


def test_greedy_generation_through_the_graphs_matches_transformers(llm, tiny_llama) -> None:
    """Three requests that finish at different steps: decode batches of 3 (replayed by the
    graph of 4 rows, one of them padding), then 2, then 1; prompts that span blocks."""
    prompts = [[5, 17, 42, 9, 100, 3, 77], [8, 1, 2], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]]
    lengths = [8, 5, 3]
    expected = hf_greedy(tiny_llama, prompts, max(lengths))
    graphs = llm.llm_engine.runner.graphs
    replays = graphs.num_replays
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [e[:n] for e, n in zip(expected, lengths)]
    assert graphs.num_replays - replays == max(lengths) - 1  # every decode step replayed
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


def test_only_the_triton_backend_is_captured(caplog) -> None:
    """The torch backend plans its decode gathers from Python lists a graph would freeze:
    with it the engine captures nothing, and says why."""
    from types import SimpleNamespace

    from nanovllm.config import EngineConfig
    from nanovllm.core.kv_cache_interface import (
        get_kv_cache_config,
        layer_specs,
        single_group_config,
    )
    from nanovllm.engine.setup import wants_cuda_graphs

    config = EngineConfig(enforce_eager=False)
    one_group = single_group_config(2, 16)
    gpu = dict(device=torch.device("cuda"), group=None, kv_cache_config=one_group)
    on_a_gpu = SimpleNamespace(attention_backend="torch", **gpu)
    assert not wants_cuda_graphs(config, on_a_gpu, backend_captures=False)
    assert "no CUDA graphs with attention backend 'torch'" in caplog.text
    triton = SimpleNamespace(attention_backend="triton", **gpu)
    assert wants_cuda_graphs(config, triton, backend_captures=True)
    assert not wants_cuda_graphs(EngineConfig(), triton, backend_captures=True)  # eager
    # A block table per KV cache group: the captured graphs hold one, so none are captured.
    specs = layer_specs(("full_attention", "sliding_attention"), 8, 2, 16)
    hybrid = SimpleNamespace(**{**vars(triton), "kv_cache_config": get_kv_cache_config(specs)})
    assert not wants_cuda_graphs(config, hybrid, backend_captures=True)
    assert "several KV cache groups" in caplog.text
