"""The visualizer on a hybrid model: one block table per KV cache group, rebuilt from events.

A tiny random Gemma 2 (a sliding layer, then a full one: two KV cache groups) runs prompts
longer than its window. After every step the state `reduce` rebuilt from the events alone must
hold, for every request, the very block tables the engine's own `KVCacheManager.block_tables`
gives (a sliding group's blocks behind the window as the null block), the free block queue in
the engine's order (the null block never in it), and each block's ref count; so must a viewer
that joins mid-run from an `EngineSnapshot`.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.core.kv_cache_usage import num_allocated_slots, num_filled_slots
from nanovllm.core.sliding_window_manager import SlidingWindowManager
from nanovllm.events import (
    EngineStarted,
    KVCacheGroupInfo,
    event_from_dict,
    event_to_dict,
)
from nanovllm.viz.figures import kv_figures
from nanovllm.viz.note import WINDOW as WINDOW_NOTE
from nanovllm.viz.state import VizState, reduce, reduce_all

WINDOW = 6


@pytest.fixture(scope="module")
def tiny_gemma2(tmp_path_factory) -> Path:
    from tiny_models import make_model

    return make_model(
        tmp_path_factory.mktemp("tiny_gemma2"),
        arch="gemma2",
        extra=dict(sliding_window=WINDOW),
    )


def check_tables(state: VizState, engine) -> None:
    kv = engine.kv_cache_manager
    assert list(state.free_queue) == [b.block_id for b in kv.free_block_queue.get_all_free_blocks()]
    null = kv.block_pool.null_block
    for block, mine in zip(kv.blocks, state.blocks, strict=True):
        if block is not null:
            assert mine.ref_count == block.ref_cnt, block
            assert len(mine.owners) == block.ref_cnt, block
    for rid in engine.scheduler.requests:
        mine = state.requests[rid].block_tables  # (groups past the last it holds blocks in: ())
        assert mine + ((),) * (kv.num_groups - len(mine)) == kv.block_tables(rid), rid
    fig = kv_figures(state)
    assert (fig.num_used_blocks, fig.num_free_blocks) == (kv.num_used_blocks, kv.num_free_blocks)
    assert fig.num_allocated_slots == num_allocated_slots(kv)
    assert fig.num_filled_slots == num_filled_slots(kv)


def check_window_notes(state: VizState, passed: set) -> None:
    """The story's window notes name exactly the blocks the engine's sliding-window manager
    freed in the step (`remove_skipped_blocks`), and no other."""
    told = {
        (n.request_id, b) for n in state.last_step.notes if n.kind == WINDOW_NOTE for b in n.blocks
    }
    assert told == passed


@contextmanager
def window_passes():
    """Within it, a set of (request id, block id) of every block a sliding window passed, as
    the engine's sliding-window manager frees it."""
    passed: set = set()
    original = SlidingWindowManager.remove_skipped_blocks

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> bool:
        before = list(self.req_to_blocks.get(request_id, []))
        removed = original(self, request_id, num_computed_tokens)
        after = self.req_to_blocks.get(request_id, [])
        passed.update((request_id, b.block_id) for b, a in zip(before, after) if a is not b)
        return removed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SlidingWindowManager, "remove_skipped_blocks", remove_skipped_blocks)
        yield passed


@settings(max_examples=examples(3), deadline=None)
@given(
    block_size=st.sampled_from([2, 4]),
    num_kv_blocks=st.integers(34, 48),
    enable_prefix_caching=st.booleans(),
    max_num_batched_tokens=st.sampled_from([8, 64]),
)
def test_each_groups_block_table_agrees_with_the_engine(
    tiny_gemma2: Path,
    block_size,
    num_kv_blocks,
    enable_prefix_caching,
    max_num_batched_tokens,
):
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_gemma2),
            num_threads=1,
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            max_num_seqs=3,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
        )
    )
    events: list = []
    box = [VizState()]

    def on_event(event):
        events.append(event)
        box[0] = reduce(box[0], event)

    engine.subscribe(on_event)
    shared = list(range(3, 17))  # 14 tokens: past the window, so hits start with null blocks
    prompts = [shared + [40 + i] * (3 + 2 * i) for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(prompts[:2]):
        engine.add_request(f"q{i}", prompt, params)
    with window_passes() as passed:
        for tick in range(200):
            if tick == 6:  # later ones can hit the first ones' cached blocks
                for i, prompt in enumerate(prompts[2:], 2):
                    engine.add_request(f"q{i}", prompt, params)
            if not engine.has_unfinished_requests() and tick > 6:
                break
            if tick == 8:  # a viewer joins: `EngineStarted`, the snapshot, then the events
                told: list = []
                engine.subscribe(told.append, snapshot=True)()
                wire = json.loads(json.dumps(event_to_dict(told[1])))
                joined = [reduce_all(VizState(), [told[0], event_from_dict(wire)]), len(events)]
                check_tables(joined[0], engine)
            passed.clear()
            engine.step()
            check_tables(box[0], engine)
            check_window_notes(box[0], set(passed))
            if tick >= 8:
                joined = [reduce_all(joined[0], events[joined[1] :]), len(events)]
                check_tables(joined[0], engine)
    started = events[0]
    assert isinstance(started, EngineStarted) and started.null_block == 0
    assert [(g.kind, g.sliding_window) for g in started.kv_cache_groups] in (
        [("sliding", WINDOW), ("full", None)],
        [("full", None), ("sliding", WINDOW)],
    )
    traced = json.loads(json.dumps(event_to_dict(started)))  # (through JSON, as a trace)
    assert event_from_dict(traced) == started
    sliding = [g.kind for g in started.kv_cache_groups].index("sliding")
    # The window passed some block while its request still ran: the null block took its place.
    assert any(e.kind == "block_freed" and e.kv_cache_group_id == sliding for e in events), (
        "no block left the sliding group"
    )
    assert 0 not in box[0].free_queue


def test_engine_started_names_a_one_group_models_group(tiny_llama: Path):
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_llama), num_threads=1, num_kv_blocks=8))
    events: list = []
    engine.subscribe(events.append)
    started = events[0]
    assert started.null_block is None
    assert started.kv_cache_groups == (KVCacheGroupInfo("full", None, (0, 1)),)


def test_the_hybrid_scenarios_model_is_the_embedded_one_within_the_window():
    """`hybrid_model.py`'s checkpoint: a full group (layers 0-1) and a sliding one (2-3), and,
    while a sequence fits in the window, the embedded model's own greedy tokens."""
    from nanovllm import LLM, SamplingParams
    from nanovllm.viz.hybrid_model import SLIDING_WINDOW, hybrid_model_path

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = "To be, or not to be"  # (with its 12 tokens, under the window)
    outputs = []
    for model in (str(hybrid_model_path()), None):
        llm = LLM(model, num_threads=1, block_size=8, num_kv_blocks=16)
        events: list = []
        llm.llm_engine.subscribe(events.append)
        outputs.append(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)
        assert len(llm.get_tokenizer().encode(prompt)) + 12 <= SLIDING_WINDOW
        if model is not None:
            groups = [(g.kind, g.layer_indices) for g in events[0].kv_cache_groups]
            assert groups == [("full", (0, 1)), ("sliding", (2, 3))]
    assert outputs[0] == outputs[1]
