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

NUM_EXPERTS, TOP_K = 4, 2


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory) -> Path:
    from tiny_models import make_model

    # (test_parity_moe.py's Mixtral: made once per run; 4 experts, top-2)
    return make_model(tmp_path_factory.mktemp("tiny_mixtral"), arch="mixtral")


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
    from nanovllm.executor.expert_load_events import ExpertLoadReader
    from nanovllm.models.moe import SparseMoeBlock
    from nanovllm.models.moe_expert_parallel import ExpertParallelFusedMoE

    block = SparseMoeBlock.__new__(SparseMoeBlock)
    torch.nn.Module.__init__(block)
    with as_tp_rank(0, 3):
        block.experts = ExpertParallelFusedMoE(10, 2, 8, 4, renormalize=True)
    block.experts.expert_load = torch.arange(10)
    model = SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(mlp=block)]))
    event = ExpertLoadReader(model).event(7)
    assert event == ExpertLoads(7, 2, (0,), (tuple(range(10)),), (0, 0, 0, 0, 1, 1, 1, 2, 2, 2))


# --- the visualizer: the reducer and the panel, without a screen --------------------------------


@st.composite
def expert_loads_events(draw, max_layers: int = 6, max_experts: int = 12):
    """A few steps' `ExpertLoads` of one random model shape (sparse layers, experts, top-k,
    expert-parallel ranks placed by `local_expert_range`), each token routed to top-k distinct
    experts in every layer. Returns (events, ep_size)."""
    from nanovllm.distributed.expert_parallel import local_expert_range

    num_layers = draw(st.integers(1, max_layers))
    num_experts = draw(st.integers(2, max_experts))
    top_k = draw(st.integers(1, num_experts))
    ep_size = draw(st.sampled_from([n for n in (1, 2, 3) if n <= num_experts]))
    ranks = ()
    if ep_size > 1:
        ranks = tuple(
            r for r in range(ep_size) for _ in local_expert_range(num_experts, r, ep_size)
        )
    layers = tuple(
        sorted(draw(st.sets(st.integers(0, 40), min_size=num_layers, max_size=num_layers)))
    )
    rng = draw(st.randoms(use_true_random=False))
    events = []
    for step in range(1, draw(st.integers(1, 4)) + 1):
        tokens = draw(st.integers(0, 30))
        counts = []
        for _ in layers:
            row = [0] * num_experts
            for _ in range(tokens):
                for e in rng.sample(range(num_experts), top_k):
                    row[e] += 1
            counts.append(tuple(row))
        events.append(ExpertLoads(step, top_k, layers, tuple(counts), ranks))
    return events, ep_size


@settings(max_examples=examples(15), deadline=None)
@given(expert_loads_events())
def test_the_reducer_keeps_the_latest_step_and_the_sums(drawn):
    """Driven without a screen: the latest step's counts, every step's summed (the oracle: the
    events added up here), each rank's pairs as `local_expert_range` places the experts; a new
    `EngineStarted` forgets them."""
    from viz_helpers import engine_started

    from nanovllm.distributed.expert_parallel import local_expert_range
    from nanovllm.viz.experts import imbalance, num_routed_tokens, rank_loads
    from nanovllm.viz.state import VizState, reduce, reduce_all

    events, ep_size = drawn
    state = reduce_all(reduce(VizState(), engine_started()), events)
    panel, last = state.experts, events[-1]
    assert panel.latest == last and panel.num_steps == len(events)
    for i in range(len(last.layers)):
        for e in range(len(last.counts[i])):
            assert panel.totals[i][e] == sum(ev.counts[i][e] for ev in events)
    num_experts = len(last.counts[0])
    for counts in last.counts:
        assert sum(counts) == num_routed_tokens(last) * last.top_k
        mean = sum(counts) / num_experts
        assert imbalance(counts) == pytest.approx(max(counts) / mean if mean else 0.0)
    if ep_size > 1:
        assert rank_loads(last) == tuple(
            sum(c[e] for c in last.counts for e in local_expert_range(num_experts, r, ep_size))
            for r in range(ep_size)
        )
    else:
        assert rank_loads(last) == ()
    # The story tells the latest step's busiest expert on the executor's line.
    top = max(max(c) for c in last.counts)
    told = [n.detail for n in state.draft.notes if "router: busiest" in (n.detail or "")]
    assert told and f", {top} of {sum(last.counts[0])} (×" in told[-1], told
    assert reduce(state, engine_started()).experts.latest is None


@settings(max_examples=examples(15), deadline=None)
@given(expert_loads_events(), st.integers(10, 90), st.integers(2, 12))
def test_the_panel_shows_or_counts_every_layer(drawn, width, height):
    """The panel's text parsed back: within its size; the step's line first; every layer's row
    either shown, with the very counts of the event (`·` for none) and its ×, or counted in
    `… N more layers`; the rank heads and `│` where expert parallelism splits the experts."""
    from viz_helpers import engine_started

    from nanovllm.viz.experts import imbalance
    from nanovllm.viz.state import VizState, reduce, reduce_all
    from nanovllm.viz.widgets.experts import SHADES, expert_lines, heat

    events, ep_size = drawn
    state = reduce_all(reduce(VizState(), engine_started()), events)
    last = events[-1]
    lines = [line.plain for line in expert_lines(state, width, height)]
    assert 1 <= len(lines) <= height and all(len(line) <= width for line in lines), lines
    assert lines[0].startswith(f"step {last.step}")
    rows = {
        int(line.split()[0][1:]): line for line in lines if line[:1] == "L" and line[1:2].isdigit()
    }
    more = [line for line in lines if line.startswith("… ")]
    counted = int(more[0].split()[1]) if more else 0
    assert sorted(rows) == sorted(last.layers[: len(rows)]) and len(rows) + counted == len(
        last.layers
    ), lines
    for layer, line in rows.items():
        counts = last.counts[last.layers.index(layer)]
        cells = line.split()[1:]
        if cells and cells[-1].startswith("×"):
            assert cells.pop() == f"×{imbalance(counts):.1f}"
        numbers = any(c.isdigit() for c in "".join(cells))
        if numbers:
            cells = [c for c in cells if c != "│"]
            assert cells == [str(n) if n else "·" for n in counts][: len(cells)], (line, counts)
        else:  # one shade an expert, `│` between ranks
            top = max(counts)
            shades = "".join(cells).replace("│", "")
            assert shades == "".join(SHADES[heat(n, top)] for n in counts)[: len(shades)]
        if ep_size > 1 and len(cells) == len(counts):
            assert line.count("│") == ep_size - 1


def test_key_0_switches_to_the_tenth_scenario():
    """`1`-`9` switch to the first nine scenarios, `0` to the tenth, `moe`."""
    from nanovllm.viz.app import VizApp
    from nanovllm.viz.scenarios import SCENARIOS

    keys = {b.key: b.action for b in VizApp.BINDINGS}
    assert list(SCENARIOS).index("moe") == 9 and keys["0"] == "scenario(9)"
    assert [keys[str(i)] for i in range(1, 10)] == [f"scenario({i})" for i in range(9)]
