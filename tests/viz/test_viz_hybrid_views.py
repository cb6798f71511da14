"""Every KV cache group in the paging diagram, the executor panel and the block tables' gauge.

A tiny random Gemma 2 has a sliding layer first, then a full one: group 0 slides. After every
step, the state rebuilt from the events alone draws, without a screen:

- the executor's events carry every group's block table and slot per token, equal to the
  engine's own tables as the step ran (`KVCacheManager.block_tables`, read while the executor's
  events are told) and to the slots those tables give each token's position;
- the executor panel lists each request's full table first and its sliding one after it (the
  null block as ∅), and its attention reads walk the full table;
- the paging diagram labels each logical block with its block in the full group and names its
  block in the sliding one (∅ once the window passed it), never the null block as a row of K/V;
- the gauge counts the last block's filled slots: every group's table has the same length, so
  it is the same whichever group it reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.geometry import Size

from nanovllm.events import StepInputsPrepared, StepSummary
from nanovllm.viz.executor import request_spans
from nanovllm.viz.state import VizState, primary_group, reduce
from nanovllm.viz.widgets import ExecutorView, PagingView

WINDOW = 6


@pytest.fixture(scope="module")
def tiny_gemma2(tmp_path_factory) -> Path:
    from tiny_models import make_model

    # (test_viz_hybrid.py's: made once per run)
    return make_model(
        tmp_path_factory.mktemp("tiny_gemma2"), arch="gemma2", extra=dict(sliding_window=WINDOW)
    )


def drawn(view, state: VizState, selected: str, size: Size, monkeypatch) -> list[str]:
    """`view`'s text for `state` at `size`, drawn without an app (its size patched in)."""
    monkeypatch.setattr(type(view), "size", property(lambda self: size))
    view.state, view.selected = state, selected
    return view.render().plain.splitlines()


def test_every_group_in_the_executor_the_paging_and_the_gauge(tiny_gemma2: Path, monkeypatch):
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    bs = 4
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_gemma2),
            num_threads=1,
            block_size=bs,
            num_kv_blocks=40,
            max_num_seqs=3,
            max_num_batched_tokens=16,
        )
    )
    kv = engine.kv_cache_manager
    box = [VizState()]
    as_ran: dict[int, dict[str, tuple]] = {}  # step -> request -> every group's table

    def on_event(event):
        box[0] = reduce(box[0], event)
        if isinstance(event, StepInputsPrepared):  # (the tables the step ran with)
            as_ran[event.step] = {rid: kv.block_tables(rid) for rid in event.request_ids}
            check_inputs(event, as_ran[event.step], bs)

    engine.subscribe(on_event)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine.add_request("a", list(range(3, 20)), params)
    engine.add_request("b", list(range(30, 38)), params)
    executor, paging = ExecutorView(), PagingView()
    passed_seen = 0
    while engine.has_unfinished_requests():
        engine.step()
        state = box[0]
        assert isinstance(state.last_step.summary, StepSummary)
        assert [g.sliding_window for g in state.engine.kv_cache_groups] == [WINDOW, None]
        full = primary_group(state)
        assert full == 1
        for rid in state.running:
            tables = kv.block_tables(rid)
            assert len({len(t) for t in tables}) == 1  # (the gauge reads any: same last block)
            passed_seen += tables[0].count(0)
            # The paging diagram: rows by the full group, the sliding group's block named.
            lines = drawn(paging, state, rid, Size(110, 200), monkeypatch)
            rows = [line for line in lines if line.startswith("L") and " → " in line]
            assert [r.split()[2] for r in rows] == [f"#{b}" for b in tables[full]], lines
            abouts = [line for line in lines if "ref " in line]
            for about, block in zip(abouts, tables[0], strict=True):
                assert f"win{WINDOW} {'∅' if block == 0 else f'#{block}'}" in about, about
            assert lines[0].endswith("rows: the full group"), lines[0]
        ex = state.executor
        for span in request_spans(ex.inputs, full):
            step_tables = as_ran[ex.step][span.request_id]
            assert span.block_table == step_tables[full][: len(span.block_table)]
            # The executor panel: the full table, then the sliding one with ∅.
            text = drawn(executor, state, span.request_id, Size(120, 40), monkeypatch)
            line = next(t for t in text if f" q@{span.query_start} " in t)
            sliding = " ".join("∅" if b == 0 else str(b) for b in span.other_tables[0])
            assert f"[{' '.join(map(str, span.block_table))}] [{sliding}]" in line, line
            reads = next(t for t in text if "L0→#" in t)
            assert f"L0→#{span.block_table[0]}[" in reads, reads
    assert passed_seen, "the window never passed a block"


def check_inputs(event: StepInputsPrepared, tables: dict[str, tuple], bs: int) -> None:
    """The event's tables and slots, every group's, against the engine's tables."""
    every_tables = (event.block_tables, *event.group_block_tables)
    every_slots = (event.slot_mapping, *event.group_slot_mappings)
    assert len(every_tables) == len(every_slots) == 2
    for g, (group_tables, slots) in enumerate(zip(every_tables, every_slots)):
        for i, rid in enumerate(event.request_ids):
            n = -(-event.seq_lens[i] // bs)
            assert group_tables[i] == tables[rid][g][:n], (g, rid)
            for row in range(event.query_start_loc[i], event.query_start_loc[i + 1]):
                pos = event.positions[row]
                assert slots[row] == tables[rid][g][pos // bs] * bs + pos % bs, (g, rid, pos)


def test_a_model_whose_every_layer_slides_shows_passed_blocks_as_null(tmp_path, monkeypatch):
    """One sliding group only (Mistral with a window): the paging rows the window passed read
    `L0 → ∅`, no K/V kept and no slots counted; the others name their block, as the engine's
    table has them."""
    from tiny_models import make_model

    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    # (test_parity_sliding.py's Mistral: made once per run)
    path = make_model(tmp_path, arch="mistral", extra=dict(sliding_window=WINDOW))
    engine = LLMEngine(EngineConfig(model=str(path), num_threads=1, block_size=4, num_kv_blocks=24))
    box = [VizState()]
    engine.subscribe(lambda event: box.__setitem__(0, reduce(box[0], event)))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine.add_request("a", list(range(3, 20)), params)
    for _ in range(3):
        engine.step()
    table = engine.kv_cache_manager.block_tables("a")[0]
    assert 0 in table  # (the null block: the window passed a block)
    lines = drawn(PagingView(), box[0], "a", Size(110, 200), monkeypatch)
    rows = [line for line in lines if line.startswith("L") and " → " in line]
    assert [r.split()[2] for r in rows] == ["∅" if b == 0 else f"#{b}" for b in table], lines
    passed = [line for line in lines if "the window passed it" in line]
    assert len(passed) == table.count(0) and not any("slots" in line for line in passed)
