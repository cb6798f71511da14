"""The `disagg` scenario: the link's reducer against a recount, and two real engines joined by
the P2pConnector, driven as the scenario drives them, headless and in the app."""

from __future__ import annotations

import asyncio
from pathlib import Path

from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_viz_state import check_against_engine
from viz_helpers import wait_until

from nanovllm.events import (
    KVBlockLoaded,
    KVBlockReceived,
    KVBlockSaved,
    KVLoadFailed,
    StepSummary,
)
from nanovllm.viz.disagg import DisaggRun, DisaggTape
from nanovllm.viz.link import (
    DECODE,
    LOADED,
    MAX_CROSSINGS,
    PREFILL,
    RECEIVED,
    SENT,
    LinkState,
    Tagged,
    reduce_link,
)
from nanovllm.viz.scenarios import SCENARIOS
from nanovllm.viz.state import VizState, reduce_all

# --- the link's reducer against a recount ------------------------------------------------------

HASHES = ("aaaaaa000000", "bbbbbb000000", "cccccc000000")


@st.composite
def link_events(draw) -> list[Tagged]:
    """Sends, arrivals, loads and failures of a few hashes, in any order, on either engine."""
    events = []
    for _ in range(draw(st.integers(0, 40))):
        h = draw(st.sampled_from(HASHES))
        kind = draw(st.sampled_from(("save", "receive", "load", "fail")))
        engine = draw(st.sampled_from((PREFILL, PREFILL, DECODE, DECODE, DECODE)))
        n = draw(st.integers(0, 3))
        event = {
            "save": KVBlockSaved(1, n, h, -1, f"r{n}"),
            "receive": KVBlockReceived(1, h, f"t{n}"),
            "load": KVBlockLoaded(1, f"r{n}", 10 + n, h, -1),
            "fail": KVLoadFailed(1, f"r{n}", "lost"),
        }[kind]
        events.append(Tagged(engine, event))
    return events


def recount(events: list[Tagged]) -> tuple[dict[str, int], list[dict]]:
    """The counts, and every crossing of the run as a dict: each arrival (load) completes the
    newest crossing of its hash that had not arrived (been loaded) yet."""
    counts = {"sent": 0, "received": 0, "loaded": 0, "failed": 0}
    crossings: list[dict] = []
    for t in events:
        e, on = t.event, t.engine
        if on == PREFILL and type(e) is KVBlockSaved:
            counts["sent"] += 1
            crossings.append(dict(hash=e.block_hash, src=e.block_id, stage=SENT, dst=None))
        elif on == DECODE and type(e) is KVBlockReceived:
            counts["received"] += 1
            todo = [c for c in crossings if c["hash"] == e.block_hash and c["stage"] == SENT]
            if todo:
                todo[-1]["stage"] = RECEIVED
        elif on == DECODE and type(e) is KVBlockLoaded:
            counts["loaded"] += 1
            todo = [c for c in crossings if c["hash"] == e.block_hash and c["stage"] != LOADED]
            if todo:
                todo[-1].update(stage=LOADED, dst=e.block_id)
        elif on == DECODE and type(e) is KVLoadFailed:
            counts["failed"] += 1
    return counts, crossings


@settings(max_examples=examples(200))
@given(events=link_events())
def test_link_reducer_against_a_recount(events):
    link = LinkState()
    for t in events:
        link = reduce_link(link, t)
    counts, crossings = recount(events)
    assert (link.num_sent, link.num_received, link.num_loaded, link.num_failed) == (
        counts["sent"],
        counts["received"],
        counts["loaded"],
        counts["failed"],
    )
    latest = crossings[-MAX_CROSSINGS:]
    assert [(c.block_hash, c.src_block, c.stage, c.dst_block) for c in link.crossings] == [
        (c["hash"], c["src"], c["stage"], c["dst"]) for c in latest
    ]


# --- two real engines ---------------------------------------------------------------------------


class Finite:
    """The scenario's workload for its first `ticks` ticks, then nothing (the run drains)."""

    def __init__(self, ticks: int) -> None:
        self.inner = SCENARIOS["disagg"].workload(0)
        self.ticks = ticks

    def arrivals(self, tick: int, busy: bool, waiting: int = 0):
        out = self.inner.arrivals(tick, busy, waiting)
        return out if tick < self.ticks else []


def test_two_engines_headless(tiny_llama: Path):
    options = {**SCENARIOS["disagg"].engine, "model": str(tiny_llama), "num_threads": 1}
    run = DisaggRun(options, Finite(12))
    try:
        tape = DisaggTape()
        events = run.take_events()
        tape.record(events)
        overlapped = False
        for _ in range(200):
            state = tape.open_state
            new, _ = run.pull(len(state.prefill.waiting) + len(state.decode.waiting))
            tape.record(new)
            events += new
            state = tape.open_state
            check_against_engine(state.prefill, run.prefill)
            check_against_engine(state.decode, run.decode)
            # One tick: a prompt prefilled on one engine while others decode on the other.
            summaries = [(t.engine, t.event) for t in new if isinstance(t.event, StepSummary)]
            overlapped |= any(
                on == PREFILL and e.num_prefill_tokens for on, e in summaries
            ) and any(on == DECODE and e.num_decode_tokens for on, e in summaries)
            if run.tick > 12 and not (
                run.plans
                or run.prefill.has_unfinished_requests()
                or run.decode.has_unfinished_requests()
            ):
                break
        state = tape.open_state
        # Each engine's state is its own events reduced, and agrees with the engine.
        for engine, mine in ((PREFILL, state.prefill), (DECODE, state.decode)):
            own = [t.event for t in events if t.engine == engine]
            assert reduce_all(VizState(), own) == mine
        assert overlapped, "no tick prefilled on one engine while the other decoded"
        assert run.prefill.kv_cache_manager.num_used_blocks == 0
        assert run.decode.kv_cache_manager.num_used_blocks == 0
        # Every block the consumer loaded was sent by the producer (hash match), and the
        # requests that decoded are the ones prefilled.
        sent = {t.event.block_hash for t in events if isinstance(t.event, KVBlockSaved)}
        loads = [t.event for t in events if isinstance(t.event, KVBlockLoaded)]
        assert loads and {e.block_hash for e in loads} <= sent
        assert all(t.engine == DECODE for t in events if isinstance(t.event, KVBlockLoaded))
        assert not any(isinstance(t.event, KVLoadFailed) for t in events)
        num_saves = sum(isinstance(t.event, KVBlockSaved) for t in events)
        assert (state.link.num_sent, state.link.num_loaded) == (num_saves, len(loads))
        assert set(state.prefill.finished) == set(state.decode.finished)
        # The story: sent, arrived, loaded, told per transfer.
        notes = [
            n.text
            for pair in tape.bounds
            for s in (pair.prefill, pair.decode)
            for n in (s.last_step.notes if s.last_step else ())
        ]
        assert any("to the decode engine" in n for n in notes)
        assert any("arrived from the prefill engine" in n for n in notes)
        assert any("from the KV the prefill engine sent" in n for n in notes)
    finally:
        run.close()


def test_disagg_scenario_in_the_app(tiny_llama: Path):
    from nanovllm.viz.app import VizApp, screen_text
    from nanovllm.viz.driver import EngineDriver

    def make(publish, notify):
        return EngineDriver(
            publish,
            notify=notify,
            scenario="disagg",
            overrides=dict(model=str(tiny_llama), num_threads=1),
            speed=0,
        )

    async def go():
        app = VizApp(make)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(
                pilot, lambda: app.pair is not None and app.pair.link.num_loaded > 0, timeout=60
            )
            await pilot.press("space")  # pause, to read a steady screen
            await pilot.pause(0.2)
            text = screen_text(app)
            assert "prefill (producer)" in text and "decode (consumer)" in text
            assert "(prefill) ──> hash" in text and "sent " in text
            assert app.screen.has_class("-disagg")
            # Two engines have no executor panel: the footer does not offer `x`, nor does it act.
            assert "executor" not in text.splitlines()[-1]
            await pilot.press("x")
            assert not app.show_executor
            await pilot.press("1")  # back to one engine
            await wait_until(pilot, lambda: app.pair is None and app.status.scenario == "steady")
            assert not app.screen.has_class("-disagg")
            await pilot.pause(0.2)
            assert "executor" in screen_text(app).splitlines()[-1]

    asyncio.run(go())


def test_the_disagg_scenario_exits_cleanly(tmp_path: Path):
    """Two engines joined by the real link in one process, then the process exits: a gloo group
    torn down while its thread is still in a call aborts the process ("terminate called without
    an active exception", exit -6), which once happened when the producer dropped its group."""
    import subprocess
    import sys

    shot = tmp_path / "disagg.svg"
    run = subprocess.run(
        [sys.executable, "-m", "nanovllm", "viz", "--scenario", "disagg", "--screenshot",
         str(shot), "--steps", "3", "--size", "160x48"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-800:] + run.stderr[-800:]
    assert shot.exists()
