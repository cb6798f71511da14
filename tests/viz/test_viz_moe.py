"""The `moe` scenario: where a mixture of experts' router sends each step's tokens.

The engine's `ExpertLoads` event is checked against an oracle of its own: every router's logits
are caught as the forward pass computes them, and each token's top-k experts counted from them
in the test (a top-k of the logits is a top-k of the softmax), for each step, each sparse
layer; and each layer's counts sum to the step's tokens times k. The plain loop and the
overlapped one (async scheduling: the next step's forward pass may run before a step's events
are told) both. The visualizer's reducer is driven without a screen, and its per-rank sums are
checked against `local_expert_range`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.events import (
    ExpertLoads,
    StepInputsPrepared,
    event_from_dict,
    event_to_dict,
)

NUM_EXPERTS, TOP_K = 6, 2


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory) -> Path:
    from tiny_models import make_model

    return make_model(
        tmp_path_factory.mktemp("tiny_mixtral"),
        arch="mixtral",
        moe=dict(num_local_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K),
    )


def router_counts(engine) -> list[dict[int, list[int]]]:
    """Catches every forward pass's routing, as a list (one entry a forward pass, in order) of
    {layer: tokens per expert}, counted from the router's logits by the test's own top-k."""
    from nanovllm.models.moe import SparseMoeBlock

    forwards: list[dict[int, list[int]]] = []
    layers = engine.runner.model.model.layers
    sparse = [i for i, layer in enumerate(layers) if isinstance(layer.mlp, SparseMoeBlock)]

    def hook(index: int):
        def caught(module, inputs, logits: torch.Tensor) -> None:  # logits [tokens, experts]
            if index == sparse[0]:
                forwards.append({})
            chosen = logits.float().topk(TOP_K, dim=-1).indices.flatten().tolist()
            forwards[-1][index] = [chosen.count(e) for e in range(NUM_EXPERTS)]

        return caught

    for i in sparse:
        layers[i].mlp.gate.register_forward_hook(hook(i))
    return forwards


@settings(max_examples=examples(4), deadline=None)
@given(
    async_scheduling=st.booleans(),
    max_num_batched_tokens=st.sampled_from([8, 64]),
    enable_prefix_caching=st.booleans(),
)
def test_expert_loads_are_the_routers_counts(
    tiny_mixtral: Path, async_scheduling, max_num_batched_tokens, enable_prefix_caching
):
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_mixtral),
            num_threads=1,
            block_size=4,
            num_kv_blocks=48,
            max_num_seqs=3,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            async_scheduling=async_scheduling,
        )
    )
    forwards = router_counts(engine)
    events: list = []
    engine.subscribe(events.append)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"q{i}", list(range(3, 3 + 9 + 4 * i)), params)
    engine.run_until_done()

    loads = [e for e in events if isinstance(e, ExpertLoads)]
    inputs = {e.step: e for e in events if isinstance(e, StepInputsPrepared)}
    assert loads and [e.step for e in loads] == sorted(inputs), "one per step that ran"
    told = [{layer: list(c) for layer, c in zip(e.layers, e.counts)} for e in loads]
    if not async_scheduling:
        assert told == forwards
        for e in loads:  # every token went to exactly k experts in every layer
            assert {sum(c) for c in e.counts} == {len(inputs[e.step].input_ids) * TOP_K}
    else:  # (a step for requests that all stopped ran, and is told by nobody)
        rest = iter(forwards)
        assert all(any(t == f for f in rest) for t in told), (told, forwards)
    for e in loads:
        assert e.top_k == TOP_K and e.expert_ranks == () and e.layers == (0, 1)
        assert event_from_dict(json.loads(json.dumps(event_to_dict(e)))) == e  # (a trace's)


def test_a_dense_model_tells_no_expert_loads(tiny_llama: Path):
    from nanovllm import LLM, SamplingParams

    llm = LLM(str(tiny_llama), num_threads=1, num_kv_blocks=16)
    events: list = []
    llm.llm_engine.subscribe(events.append)
    llm.generate([[3, 4, 5]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert any(isinstance(e, StepInputsPrepared) for e in events)
    assert not any(isinstance(e, ExpertLoads) for e in events)


def test_expert_parallel_ranks_hold_contiguous_runs():
    """With expert parallelism the event names each expert's rank: rank 0's layer (built as
    rank 0 of 3) tells the placement of all 10 experts, 4 3 3."""
    from types import SimpleNamespace

    from nanovllm.distributed.parallel_state import as_tp_rank
    from nanovllm.executor.expert_load_events import expert_loads_event
    from nanovllm.models.moe import SparseMoeBlock
    from nanovllm.models.moe_expert_parallel import ExpertParallelFusedMoE

    block = SparseMoeBlock.__new__(SparseMoeBlock)
    torch.nn.Module.__init__(block)
    with as_tp_rank(0, 3):
        block.experts = ExpertParallelFusedMoE(10, 2, 8, 4, renormalize=True)
    block.experts.expert_load = torch.arange(10)
    model = SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(mlp=block)]))
    event = expert_loads_event(7, model)
    assert event == ExpertLoads(7, 2, (0,), (tuple(range(10)),), (0, 0, 0, 0, 1, 1, 1, 2, 2, 2))
