"""The KV connector's tier in the visualizer (`viz/tier.py`): the reducer against a real engine.

A real engine with the OffloadingConnector, a device pool of a few blocks (so cached prefixes are
evicted) and a host tier of a few slots (so the tier drops entries too), runs workloads whose
requests come back to earlier prefixes. After every step the reduced tier must equal

- an independent oracle that replays only the saved / dropped events, naively (slot -> hash);
- the engine's own tier: which hash each slot holds and the LRU order (`HostBlockTier`);
- the engine's counters: loads * block_size == `scheduler.external_prefix_cache_hits`, and
  saves - drops == the entries the tier holds;

and the rest of the state must still agree with the engine (`check_against_engine`).
"""

from __future__ import annotations

from pathlib import Path

from budget import examples
from hypothesis import event as note
from hypothesis import given, settings
from hypothesis import strategies as st
from test_viz_state import check_against_engine

from nanovllm.core.block_hash import short
from nanovllm.events import (
    BlockAllocated,
    BlockEvicted,
    EngineStarted,
    KVBlockLoaded,
    KVBlockSaved,
    KVLoadFailed,
    KVTierEvicted,
    RequestAdded,
    StepSummary,
)
from nanovllm.viz.state import StepRecord, VizState, reduce, reduce_all
from nanovllm.viz.widgets.tier import slot_rows, traffic_line


def started(num_tier_blocks: int = 3, connector: str = "OffloadingConnector") -> EngineStarted:
    return EngineStarted(
        "m", 8, 4, 4, 16, 64, True, True, "torch",
        kv_connector=connector, kv_role="kv_both", num_tier_blocks=num_tier_blocks,
    )  # fmt: skip


def summary(step: int) -> StepSummary:
    return StepSummary(step, {}, 0, 0, 0, 0, 0, 0, 8, 0, 0, 1e-4, 1e-3)


def pool_eviction(block: int, block_hash: str, rid: str = "x") -> list:
    """The device pool hands out `block`, which cached `block_hash`."""
    return [BlockEvicted(block, block_hash), BlockAllocated(rid, block, 0)]


# --- hand-written sequences ---------------------------------------------------------------------


def test_no_connector_no_tier():
    state = reduce(VizState(), EngineStarted("m", 8, 4, 4, 16, 64, True, True, "torch"))
    assert state.tier.connector is None and not state.tier.has_slots
    state = reduce_all(state, pool_eviction(0, "h0"))
    assert state.tier.pending == ()


def test_saves_fill_slots_and_a_full_tier_drops_its_least_recently_used():
    s = reduce_all(
        reduce(VizState(), started(num_tier_blocks=2)),
        [RequestAdded("x", None, 4, 4)]
        + pool_eviction(0, "a")
        + pool_eviction(1, "b")
        + [KVBlockSaved(1, 0, "a", 0), KVBlockSaved(1, 1, "b", 1), summary(1)],
    )
    assert s.tier.slots == ("a", "b") and s.tier.lru == ("a", "b")
    assert s.last_step.saved == ((0, 0), (1, 1)) and s.tier.next_dropped() == 0
    s = reduce_all(
        s,
        pool_eviction(2, "c") + [KVTierEvicted(2, "a", 0), KVBlockSaved(2, 2, "c", 0), summary(2)],
    )
    assert s.tier.slots == ("c", "b") and s.tier.lru == ("b", "c")
    assert s.last_step.dropped == (0,) and s.last_step.saved == ((2, 0),)
    assert (s.tier.num_saved, s.tier.num_dropped) == (3, 1)


def test_lru_order_follows_the_engine_not_the_event_order():
    """Step 3: a hit on `a` (touched while scheduling), then the pool evicts `d` (new: saved)
    and `b` (in the tier: touched, no event). The engine's order is c, a, d, b; the events come
    as save d, load a."""
    s = reduce_all(
        reduce(VizState(), started(num_tier_blocks=4)),
        [RequestAdded("x", None, 4, 4)]
        + pool_eviction(0, "a")
        + pool_eviction(1, "b")
        + pool_eviction(2, "c")
        + [KVBlockSaved(1, 0, "a", 0), KVBlockSaved(1, 1, "b", 1), KVBlockSaved(1, 2, "c", 2)]
        + [summary(1)],
    )
    assert s.tier.lru == ("a", "b", "c")
    s = reduce_all(
        s,
        pool_eviction(3, "d")
        + pool_eviction(4, "b")
        + [KVBlockSaved(2, 3, "d", 3), KVBlockLoaded(2, "x", 5, "a", 0)],
    )
    assert s.tier.lru == ("c", "a", "d", "b")
    assert s.draft.loaded == ((0, 5),)
    s = reduce(s, summary(2))
    assert s.tier.lru == ("c", "a", "d", "b") and s.tier.pending == ()


def test_the_story_and_the_traffic_line_tell_saves_drops_and_loads():
    s = reduce_all(
        reduce(VizState(), started(num_tier_blocks=1)),
        [RequestAdded("x", None, 4, 4)]
        + pool_eviction(0, "a")
        + [KVBlockSaved(1, 0, "a", 0), summary(1)]
        + pool_eviction(3, "b")
        + [KVTierEvicted(2, "a", 0), KVBlockSaved(2, 3, "b", 0)]
        + [KVBlockLoaded(2, "x", 5, "b", 0), KVBlockLoaded(2, "x", 6, "b", 0)],
    )
    texts = [n.text for n in s.draft.notes]
    assert texts[-2] == (
        "host tier saves blocks the device pool hands out again: block 3 -> slot 0; the tier "
        "was full, so it dropped its least recently used: slot 0 (a)"
    )
    assert texts[-1] == (
        "x host tier hit: slot 0 -> block 5, slot 0 -> block 6 (KV copied in before the "
        "forward pass, not computed)"
    )
    assert s.draft.notes[-1].blocks == (5, 6) and s.draft.notes[-2].blocks == (3,)
    assert traffic_line(s.draft) == "step 2: loaded t0→b5, t0→b6; saved b3→t0; dropped t0"
    assert traffic_line(StepRecord(step=4)) == "step 4: no transfers"


@settings(max_examples=examples(60))
@given(st.integers(1, 300), st.integers(8, 120), st.integers(1, 4))
def test_slot_rows_keep_slot_order_in_groups_of_eight(num_slots: int, width: int, lines: int):
    """Every row fits the width, starts with the label of its first slot, and the rows hold
    the slots in order (all of them, unless `…` says the rows ran out)."""
    from rich.style import Style

    chars = "abcdefghijklmnopqrstuvwxyz"
    cells = [(chars[i % 26], Style()) for i in range(num_slots)]
    rows = slot_rows(cells, width, lines)
    assert 1 <= len(rows) <= lines
    shown, label = "", len(f"t{num_slots - 1} ")
    for row in rows:
        text = row.plain
        assert len(text) <= max(width, label + 2), (text, width)
        assert text.startswith(f"t{len(shown)}".ljust(label))
        body = text[label:].removesuffix("…")
        groups = body.split(" ")
        assert all(len(g) == 8 for g in groups[:-1]) and 1 <= len(groups[-1]) <= 8
        shown += "".join(groups)
    assert shown == "".join(c for c, _ in cells[: len(shown)])
    assert (len(shown) < num_slots) == rows[-1].plain.endswith("…")


def test_shared_storage_counts_without_slots():
    s = reduce_all(
        reduce(VizState(), started(num_tier_blocks=0, connector="SharedStorageConnector")),
        [
            KVBlockSaved(1, 3, "a", request_id="x"),
            KVBlockLoaded(1, "y", 5, "a"),
            KVLoadFailed(1, "y", "cannot load a.pt"),
        ],
    )
    t = s.tier
    assert not t.has_slots and (t.num_saved, t.num_loaded, t.num_failed) == (1, 1, 1)
    assert s.draft.saved == ((3, -1),) and s.draft.loaded == ((-1, 5),)
    assert t.failures == (("y", "cannot load a.pt"),) and s.draft.load_failed == ("y",)
    assert traffic_line(s.draft) == "step 0: loaded b5; saved b3; load failed: y"
    assert [n.text for n in s.draft.notes] == [
        "x saves blocks 3 to shared storage (another engine can load them)",
        "y loads blocks 5 from shared storage instead of computing them",
        "y: loading its KV failed (cannot load a.pt); the step is undone and it computes "
        "those tokens instead",
    ]


# --- against the real engine ---------------------------------------------------------------------


@st.composite
def offload_runs(draw):
    """A tiny device pool and tier, and requests made of a few shared "documents" (whole
    blocks) and a suffix; documents come back later, after the pool has evicted them."""
    block_size = draw(st.sampled_from([2, 4]))
    config = dict(
        block_size=block_size,
        num_kv_blocks=draw(st.integers(5, 10)),
        max_num_seqs=draw(st.integers(1, 3)),
        max_num_batched_tokens=draw(st.sampled_from([8, 16, 32])),
    )
    num_cpu_blocks = draw(st.integers(1, 8))
    docs = draw(
        st.lists(
            st.lists(st.integers(3, 200), min_size=block_size, max_size=3 * block_size).map(
                lambda d: d[: len(d) // block_size * block_size]
            ),
            min_size=2,
            max_size=4,
        )
    )
    requests = draw(
        st.lists(
            st.tuples(
                st.integers(0, 30),  # arrival tick
                st.integers(0, len(docs) - 1),  # which document it starts with
                st.lists(st.integers(3, 200), min_size=1, max_size=5),  # its own suffix
                st.integers(1, 8),  # max_tokens
            ),
            min_size=4,
            max_size=12,
        )
    )
    return config, num_cpu_blocks, docs, requests


def touched_after_a_save(events: list) -> bool:
    """Whether in some step the pool evicted a hash the tier held (a touch, no event) after
    one the tier saved: the touch then comes after that save in the engine's order, though
    its `BlockEvicted` came first."""
    evicted: list[str] = []
    saved: set[str] = set()
    for before, e in zip(events, events[1:]):
        if isinstance(e, BlockAllocated) and isinstance(before, BlockEvicted):
            if before.block_id == e.block_id:
                evicted.append(before.block_hash)
        elif isinstance(e, KVBlockSaved):
            saved.add(e.block_hash)
        elif isinstance(e, StepSummary):
            first_save = next((i for i, h in enumerate(evicted) if h in saved), len(evicted))
            if any(h not in saved for h in evicted[first_save + 1 :]):
                return True  # (or a save dropped for want of an unpinned slot: rare)
            evicted, saved = [], set()
    return False


class Watched:
    """An engine on the CPU, every event it emitted, and the state reduced from them."""

    def __init__(self, **config) -> None:
        from nanovllm.config import EngineConfig
        from nanovllm.engine.llm_engine import LLMEngine

        self.engine = LLMEngine(EngineConfig(num_threads=1, **config))
        self.events: list = []
        self.state = VizState()
        self.engine.subscribe(self._on_event)

    def _on_event(self, event) -> None:
        self.events.append(event)
        self.state = reduce(self.state, event)


def naive_slots(events: list, num_slots: int) -> dict[int, str]:
    """Slot -> hash, from the saved and dropped events alone."""
    slots: dict[int, str] = {}
    for e in events:
        if isinstance(e, KVTierEvicted):
            assert slots.pop(e.tier_slot) == e.block_hash
        elif isinstance(e, KVBlockSaved):
            assert e.tier_slot not in slots and 0 <= e.tier_slot < num_slots
            slots[e.tier_slot] = e.block_hash
    return slots


def check_tier(state: VizState, engine, events: list) -> None:
    tier, mine = engine.kv_source.tier, state.tier
    engine_slots = {slot: short(h) for h, slot in tier.slot_of.items()}
    assert dict(enumerate(mine.slots)) == {i: engine_slots.get(i) for i in range(tier.num_blocks)}
    assert {i: h for i, h in enumerate(mine.slots) if h} == naive_slots(events, tier.num_blocks)
    assert list(mine.lru) == [short(h) for h in tier.slot_of]  # least recently used first
    assert mine.num_loaded * state.block_size == engine.scheduler.external_prefix_cache_hits
    assert mine.num_saved - mine.num_dropped == len(tier)
    assert mine.num_loaded == sum(isinstance(e, KVBlockLoaded) for e in events)


@settings(max_examples=examples(20), deadline=None)
@given(workload=offload_runs())
def test_tier_agrees_with_engine(tiny_llama: Path, workload):
    from nanovllm.sampling_params import SamplingParams

    config, num_cpu_blocks, docs, requests = workload
    kv_transfer_config = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {"num_cpu_blocks": num_cpu_blocks},
    }
    run = Watched(model=str(tiny_llama), kv_transfer_config=kv_transfer_config, **config)
    engine = run.engine
    for tick in range(300):  # (it stops once every request is done)
        for i, (arrival, doc, suffix, max_tokens) in enumerate(requests):
            if arrival == tick:
                params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
                try:
                    engine.add_request(f"q{i}", docs[doc] + suffix, params)
                except ValueError:
                    pass  # too big for this KV cache: a RequestRejected event
        if engine.has_unfinished_requests():
            engine.step()
            check_against_engine(run.state, engine)
            check_tier(run.state, engine, run.events)
        elif tick > 12:
            break
    state = run.state
    note(f"tier hits: {state.tier.num_loaded > 0}")
    note(f"tier drops: {state.tier.num_dropped > 0}")
    note(f"a touch after a save: {touched_after_a_save(run.events)}")
    assert state.tier.connector == "OffloadingConnector"
    assert state.tier.num_blocks == num_cpu_blocks
    assert state.tier.num_failed == 0 and not any(isinstance(e, KVLoadFailed) for e in run.events)


def test_a_touch_after_a_save_keeps_the_engines_lru_order(tiny_llama: Path):
    """A planned run where the pool, in one step, hands out a block the tier does not hold
    (saved) and then blocks whose prefix came from the tier (touched, no event): requests
    return to one document between long prompts that take the whole pool. The random runs
    above rarely build this; the reduced LRU order must still be the engine's."""
    from nanovllm.sampling_params import SamplingParams

    offload = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {"num_cpu_blocks": 16},
    }
    run = Watched(
        model=str(tiny_llama),
        block_size=2,
        num_kv_blocks=8,
        max_num_seqs=1,
        max_num_batched_tokens=32,
        kv_transfer_config=offload,
    )
    doc = [5, 6, 7, 8]
    plan = [(doc + [9], 2), (list(range(20, 34)), 1), (doc + [10], 5), (list(range(40, 54)), 1)]
    plan += [(doc + [11], 5), (list(range(60, 74)), 1)]
    for i, (prompt, max_tokens) in enumerate(plan):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        run.engine.add_request(f"r{i}", prompt, params)
        while run.engine.has_unfinished_requests():
            run.engine.step()
            check_against_engine(run.state, run.engine)
            check_tier(run.state, run.engine, run.events)
    assert touched_after_a_save(run.events) and run.state.tier.num_loaded > 0


def test_shared_storage_saves_loads_and_a_failed_load_against_engines(
    tiny_llama: Path, tmp_path: Path
):
    """SharedStorageConnector, two engines: a producer saves a prompt's blocks to files, a
    consumer loads them for the same prompt, a second consumer finds one file spoiled (its load
    fails, the step is undone and the request computes). The reduced counts equal the files
    written, the engines' external hits and the failures."""
    from nanovllm.sampling_params import SamplingParams

    def engine(role: str) -> Watched:
        config = {
            "kv_connector": "SharedStorageConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
        }
        return Watched(model=str(tiny_llama), block_size=4, kv_transfer_config=config)

    def finish(run: Watched, prompt: list[int]) -> VizState:
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        run.engine.add_request("r", prompt, params)
        while run.engine.has_unfinished_requests():
            run.engine.step()
            check_against_engine(run.state, run.engine)
        hits = run.engine.scheduler.external_prefix_cache_hits
        assert run.state.tier.num_loaded * 4 == hits
        assert not run.state.tier.has_slots and run.state.tier.connector == "SharedStorageConnector"
        return run.state

    prompt = list(range(10, 31))  # 21 tokens: blocks 0-4 loadable, the last token computed
    loadable = (len(prompt) - 1) // 4
    producer = finish(engine("kv_producer"), prompt)
    files = list(tmp_path.rglob("*.pt"))
    assert producer.tier.num_saved == len(files) >= loadable and producer.tier.num_loaded == 0
    consumer = finish(engine("kv_consumer"), prompt).tier
    assert (consumer.num_saved, consumer.num_loaded, consumer.num_failed) == (0, loadable, 0)
    for file in files:
        file.write_bytes(b"not a tensor file")
    spoiled = finish(engine("kv_consumer"), prompt).tier
    assert spoiled.num_failed == 1 and spoiled.failures[0][0] == "r"
    assert spoiled.num_loaded == loadable  # announced, then undone: the engine counts them too


def test_offload_scenario_fills_the_tier_and_serves_hits():
    """The `offload` scenario's engine and workload on the embedded model (the scenario is sized
    for its tokenizer): within 60 steps the tier fills, drops entries and serves hits, and the
    reduced tier matches the engine's."""
    from nanovllm.sampling_params import SamplingParams
    from nanovllm.viz.scenarios import SCENARIOS

    scenario = SCENARIOS["offload"]
    run = Watched(**scenario.engine)
    engine = run.engine
    workload = scenario.workload(0)
    n = 0
    for tick in range(60):
        for a in workload.arrivals(tick, engine.has_unfinished_requests(), len(run.state.waiting)):
            params = SamplingParams(temperature=a.temperature, max_tokens=a.max_tokens, seed=a.seed)
            engine.add_request(f"r{n}", a.prompt, params)
            n += 1
        if engine.has_unfinished_requests():
            engine.step()
    check_tier(run.state, engine, run.events)
    tier = run.state.tier
    assert tier.num_filled == tier.num_blocks, "the tier fills"
    assert tier.num_loaded > 0 and tier.num_dropped > 0, (tier.num_loaded, tier.num_dropped)


def test_offload_scenario_panel_in_the_app():
    """The live app on the `offload` scenario (embedded model): the tier's panel sits beside
    the free queue with its slots and counts, and a step that loaded from the tier shows its
    traffic line and its story. Without a connector the panel is hidden."""
    import asyncio

    from viz_helpers import wait_until

    from nanovllm.viz.app import VizApp, screen_text
    from nanovllm.viz.driver import EngineDriver

    steps = 60

    def make(publish, notify):
        return EngineDriver(
            publish,
            notify=notify,
            scenario="offload",
            overrides=dict(num_threads=1),
            speed=0,
            max_steps=steps,
        )

    async def go():
        app = VizApp(make)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(
                pilot, lambda: app.state.step == steps and app.status.paused, timeout=120
            )
            tier = app.state.tier
            assert tier.num_loaded > 0 and tier.num_filled == tier.num_blocks
            assert app.screen.has_class("-tier") and app.query_one("#tier").display
            text = screen_text(app)
            assert "OffloadingConnector" in text and "Free block queue" in text
            assert f"{tier.num_filled}/{tier.num_blocks}" in text and "t0  " in text
            # Back through the history to the last step that loaded from the tier.
            while not app.state.last_step.loaded:
                step = app.state.step
                await pilot.press("left")
                await wait_until(pilot, lambda step=step: app.state.step == step - 1)
            await pilot.pause(0.1)
            slot, block = app.state.last_step.loaded[0]
            text = screen_text(app)
            assert f"loaded t{slot}→b{block}" in text, text
            assert "host tier hit" in text

    asyncio.run(go())


def test_a_viewer_joining_mid_run_starts_from_the_engines_tier(tiny_llama: Path):
    """`EngineSnapshot.tier` (through JSON, as `viz --connect` receives it): a viewer that
    joins once the tier holds entries shows the engine's slots and LRU order at once, and at
    every step after, as the events apply on top."""
    import json

    from nanovllm.events import event_from_dict, event_to_dict
    from nanovllm.sampling_params import SamplingParams

    offload = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {"num_cpu_blocks": 6},
    }
    run = Watched(
        model=str(tiny_llama), block_size=2, num_kv_blocks=8, max_num_seqs=1,
        max_num_batched_tokens=32, kv_transfer_config=offload,
    )  # fmt: skip
    engine, late, seen, checks = run.engine, None, 0, 0
    doc = [5, 6, 7, 8]
    plan = [(doc + [9], 2), (list(range(20, 34)), 1), (doc + [10], 5), (list(range(40, 54)), 1)]
    plan += [(doc + [11], 5), (list(range(60, 74)), 1), (doc + [12], 3)]
    for i, (prompt, max_tokens) in enumerate(plan):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
            if late is None and len(engine.kv_source.tier) >= 3:
                wire = json.loads(json.dumps(event_to_dict(snapshot_now(engine))))
                late = reduce(reduce(VizState(), engine.started_event), event_from_dict(wire))
                seen = len(run.events)
            elif late is not None:
                for event in run.events[seen:]:
                    late = reduce(late, event)
                seen = len(run.events)
            if late is not None:
                tier = engine.kv_source.tier
                by_slot = {slot: short(h) for h, slot in tier.slot_of.items()}
                assert late.tier.slots == tuple(by_slot.get(i) for i in range(tier.num_blocks))
                assert list(late.tier.lru) == [short(h) for h in tier.slot_of]
                checks += 1
    assert checks > 5 and late.tier.num_loaded > 0


def snapshot_now(engine):
    """The engine's state now, as a subscriber that joins now receives it after `EngineStarted`."""
    told = []
    engine.subscribe(told.append, snapshot=True)()  # (and unsubscribed at once)
    return told[1]
