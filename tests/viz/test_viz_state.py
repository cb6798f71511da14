"""The reducer: hand-written event sequences, the committed trace, and a real engine.

The property test runs the real engine (the tiny random model, a KV cache of a few blocks so
preemption and prefix caching happen, speculative decoding on or off, requests with n > 1) on
random workloads, folds every event into `reduce`, and after every step (and every abort)
checks the rebuilt state against the engine's own figures: the free queue's order, every block
table, ref counts and cached flags, the queues, the block and slot counts, preemptions,
prefix-cache hits, the speculative decoding counts and the parallel-sampling families.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from budget import examples
from hypothesis import event as note
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.core.kv_cache_usage import num_allocated_slots, num_filled_slots
from nanovllm.events import (
    EVENT_TYPES,
    BlockAllocated,
    BlockCached,
    BlockEvicted,
    BlockFreed,
    CacheHit,
    EngineStarted,
    GrammarMasked,
    KVBlockLoaded,
    KVBlockSaved,
    KVLoadFailed,
    KVTierEvicted,
    RequestAdded,
    RequestFinished,
    RequestPreempted,
    RequestRejected,
    RequestScheduled,
    SpecTokensVerified,
    StepSummary,
    TokenEmitted,
)
from nanovllm.viz.state import (
    CHUNK,
    DECODE,
    FINISHED,
    MAX_FINISHED,
    PREEMPTED,
    PREFILL,
    RUNNING,
    SPEC,
    WAIT,
    WAITING,
    VizState,
    family_of,
    initial_state,
    kv_figures,
    last_block_fill,
    rank_forward_times,
    reduce,
    reduce_all,
)
from nanovllm.viz.style import rank_times


def started(num_blocks: int = 4, block_size: int = 4) -> EngineStarted:
    return EngineStarted(
        model="m",
        num_kv_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_model_len=64,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        attention_backend="torch",
    )


def summary(step: int, **kw) -> StepSummary:
    fields = dict(
        scheduled={},
        num_prefill_tokens=0,
        num_decode_tokens=0,
        num_running=0,
        num_waiting=0,
        num_used_blocks=0,
        num_cached_free_blocks=0,
        num_free_blocks=0,
        num_allocated_slots=0,
        num_filled_slots=0,
        schedule_time=0.001,
        forward_time=0.009,
    )
    fields.update(kw)
    return StepSummary(step=step, **fields)


# --- hand-written sequences ---------------------------------------------------------------------


def test_engine_started_sets_up_free_queue_and_resets():
    state = reduce(VizState(), started(num_blocks=5))
    assert state.free_queue == (0, 1, 2, 3, 4)
    assert state.num_blocks == 5 and state.block_size == 4
    state = reduce(state, RequestAdded("a", "hi", 3, 4))
    again = reduce(state, started(num_blocks=3))  # a new engine: everything starts over
    assert again.requests == {} and again.free_queue == (0, 1, 2)


def test_free_queue_head_middle_tail():
    s = initial_state(started(num_blocks=5))
    s = reduce_all(
        s,
        [
            RequestAdded("a", "x", 6, 4),
            BlockAllocated("a", 0, 0),  # from the head
            BlockAllocated("a", 1, 1),
            BlockCached("a", 0, "h0"),
            RequestScheduled(1, "a", 6, 0, True, False),
        ],
    )
    assert s.free_queue == (2, 3, 4)
    assert s.requests["a"].block_table == (0, 1)
    assert s.requests["a"].status == RUNNING and s.running == ("a",)
    s = reduce_all(
        s,
        [
            BlockFreed("a", 1, 0, False),  # freed tail first, joins the queue's tail
            BlockFreed("a", 0, 0, True),
            RequestFinished(1, "a", "length", 6, 4),
            summary(1),
        ],
    )
    assert s.free_queue == (2, 3, 4, 1, 0)
    assert s.last_step.taken == (0, 1) and s.last_step.returned == (1, 0)
    assert s.blocks[0].cached and not s.blocks[1].cached
    assert s.blocks[0].last_owner == "a" and s.blocks[0].owners == ()
    # A prefix hit takes block 0 out of the queue where it sits; a fresh block (2, after its
    # stale prefix is evicted) comes off the head.
    s = reduce_all(
        s,
        [
            RequestAdded("b", "x", 6, 4),
            CacheHit("b", 0, 0, True, 1),
            BlockEvicted(2, "old"),
            BlockAllocated("b", 2, 1),
            RequestScheduled(2, "b", 2, 4, True, False),
        ],
    )
    assert s.free_queue == (3, 4, 1)
    assert s.requests["b"].block_table == (0, 2)
    assert s.requests["b"].num_cached_tokens == 4
    assert s.draft.pulled == (0,) and s.draft.taken == (2,)
    assert s.metrics.prefix_hits == 4 and s.metrics.prefix_queries == 6 + 6


def test_shared_block_ref_counts():
    s = initial_state(started(num_blocks=4))
    s = reduce_all(
        s,
        [
            RequestAdded("a", None, 8, 4),
            RequestAdded("b", None, 8, 4),
            BlockAllocated("a", 0, 0),
            BlockCached("a", 0, "h"),
            BlockAllocated("a", 1, 1),
            RequestScheduled(1, "a", 8, 0, True, False),
            CacheHit("b", 0, 0, False, 2),
            BlockAllocated("b", 2, 1),
            RequestScheduled(1, "b", 4, 4, True, False),
        ],
    )
    assert s.blocks[0].ref_count == 2 and s.blocks[0].owners == ("a", "b")
    figures = kv_figures(s)
    assert figures.num_used_blocks == 3 and figures.num_shared_blocks == 1
    # filled: a has 8 tokens, b 8, block 0 counted once
    assert figures.num_filled_slots == 8 + 8 - 4 and figures.num_allocated_slots == 12
    s = reduce(s, BlockFreed("a", 0, 1, True))
    assert s.blocks[0].ref_count == 1 and 0 not in s.free_queue


def test_preemption_moves_request_to_front_of_waiting():
    s = initial_state(started(num_blocks=4))
    s = reduce_all(
        s,
        [
            RequestAdded("a", None, 4, 8),
            RequestAdded("b", None, 4, 8),
            BlockAllocated("a", 0, 0),
            RequestScheduled(1, "a", 4, 0, True, False),
            BlockAllocated("b", 1, 0),
            RequestScheduled(1, "b", 4, 0, True, False),
            summary(1),
            RequestAdded("c", None, 4, 8),
            BlockFreed("b", 1, 0, False),
            RequestPreempted(2, "b", 5),
            BlockAllocated("a", 1, 1),
            RequestScheduled(2, "a", 1, 4, False, False),
            summary(2),
        ],
    )
    assert s.waiting == ("b", "c") and s.running == ("a",)
    b = s.requests["b"]
    assert b.status == WAITING and b.num_preemptions == 1 and b.block_table == ()
    assert b.num_computed_tokens == 0
    assert s.metrics.num_preemptions == 1
    column = s.timeline[-1]
    assert column.cells == {"a": DECODE, "b": PREEMPTED, "c": WAIT}
    assert s.last_step.preempted == ("b",)


def test_timeline_cells_and_step_records():
    s = initial_state(started(num_blocks=8))
    s = reduce_all(
        s,
        [
            RequestAdded("a", None, 10, 2),
            RequestScheduled(1, "a", 8, 0, True, True),
            summary(1, num_prefill_tokens=8),
            RequestScheduled(2, "a", 2, 8, True, False),
            TokenEmitted(2, "a", 5, "x", 1),
            summary(2, num_prefill_tokens=2),
            RequestScheduled(3, "a", 1, 10, False, False),
            TokenEmitted(3, "a", 6, "y", 2),
            RequestFinished(3, "a", "length", 10, 2),
            summary(3, num_decode_tokens=1),
        ],
    )
    assert [c.cells["a"] for c in s.timeline] == [CHUNK, PREFILL, DECODE]
    assert s.step == 3 and s.last_step.finished == ("a",)
    assert s.requests["a"].output_text == "xy" and s.requests["a"].status == FINISHED
    assert s.metrics.num_steps == 3 and s.metrics.num_tokens == 11
    assert s.metrics.tokens_per_s == pytest.approx(11 / 0.03)
    assert s.draft.scheduled == ()


def test_each_ranks_forward_time_is_the_last_steps_with_tensor_parallelism():
    """The step summary's per-rank forward times reach the state, step by step, only when the
    engine runs on more than one rank (without tensor parallelism the engine reports one)."""
    two = dataclasses.replace(started(), tensor_parallel_size=2)
    s = reduce(VizState(), two)
    assert s.tensor_parallel_size == 2 and rank_forward_times(s) == ()  # no step yet
    s = reduce(s, summary(1, rank_forward_times=(0.0031, 0.0029)))
    assert rank_forward_times(s) == (0.0031, 0.0029)
    s = reduce(s, RequestAdded("a", None, 3, 2))  # mid-step: still the last step's
    assert rank_forward_times(s) == (0.0031, 0.0029)
    s = reduce(s, summary(2, rank_forward_times=(0.004, 0.005)))
    assert rank_forward_times(s) == (0.004, 0.005)
    alone = reduce_all(VizState(), [started(), summary(1, rank_forward_times=(0.003,))])
    assert alone.tensor_parallel_size == 1 and rank_forward_times(alone) == ()
    assert rank_times((0.0031, 0.0029)) == "3.1 / 2.9 ms"
    assert rank_times(tuple(i / 1000 for i in range(1, 9))) == "1.0-8.0 ms"


def test_rejected_request_does_not_touch_the_existing_one():
    s = initial_state(started())
    s = reduce_all(s, [RequestAdded("a", "p", 2, 2), RequestRejected("a", "duplicate id")])
    assert list(s.requests) == ["a"] and s.waiting == ("a",)
    assert s.rejected == (("a", "duplicate id"),) and s.metrics.num_rejected == 1


def test_finished_requests_are_bounded():
    s = initial_state(started())
    for i in range(MAX_FINISHED + 5):
        s = reduce_all(
            s, [RequestAdded(f"r{i}", None, 1, 1), RequestFinished(0, f"r{i}", "abort", 1, 0)]
        )
    assert len(s.finished) == MAX_FINISHED and len(s.requests) == MAX_FINISHED
    assert s.metrics.num_finished == MAX_FINISHED + 5


def test_last_block_fill():
    s = initial_state(started(block_size=4))
    s = reduce_all(
        s,
        [
            RequestAdded("a", None, 5, 4),
            BlockAllocated("a", 0, 0),
            BlockAllocated("a", 1, 1),
            RequestScheduled(1, "a", 5, 0, True, False),
        ],
    )
    assert last_block_fill(s, s.requests["a"]) == 1


def test_rejected_proposals_roll_back_and_free_their_block_while_the_request_runs():
    """A decode of 1 + 3 tokens crosses into a new block; 1 proposal is accepted, 2 are
    rejected: the request keeps its first block, the second (only rejected slots) goes to the
    free queue's tail, and `num_computed_tokens` steps back over the rejected slots."""
    s = initial_state(started(num_blocks=4, block_size=4))
    s = reduce_all(
        s,
        [
            RequestAdded("a", None, 2, 8),
            BlockAllocated("a", 0, 0),
            RequestScheduled(1, "a", 2, 0, True, False),
            TokenEmitted(1, "a", 7, "x", 1),
            summary(1),
            # Step 2: tokens 2 (its own) and 3-5 (proposed) need slots 2-5: a second block.
            BlockAllocated("a", 1, 1),
            RequestScheduled(2, "a", 4, 2, False, False),
        ],
    )
    assert s.requests["a"].num_computed_tokens == 6 and s.requests["a"].block_table == (0, 1)
    assert s.free_queue == (2, 3)
    s = reduce_all(
        s,
        [
            SpecTokensVerified(2, "a", (7, 8, 9), 1),
            BlockFreed("a", 1, 0, False),
            TokenEmitted(2, "a", 7, "y", 2),
            TokenEmitted(2, "a", 5, "z", 3),
            summary(2),
        ],
    )
    a = s.requests["a"]
    assert a.status == RUNNING and a.block_table == (0,)
    assert a.num_computed_tokens == 4 and a.num_tokens == 5  # 2 prompt + 3 output
    assert s.free_queue == (2, 3, 1) and s.blocks[1].owners == ()
    assert a.accepted == ((3, 1),) and a.accepted_positions() == {3}
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (3, 1)
    m = s.metrics
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (1, 3, 1)
    assert m.acceptance_rate == pytest.approx(1 / 3) and m.mean_accepted_length == 2
    assert s.timeline[-1].cells == {"a": SPEC}
    assert s.last_step.verified == (("a", 3, 1),) and s.last_step.scheduled[0].num_proposed == 3
    texts = [n.text for n in s.last_step.notes]
    assert "a: proposed 3, accepted 1, rejected 2 (+1 token of its own); block 1 to the tail" in (
        texts
    )
    assert "decode, with proposals to verify: a 1+3" in texts
    assert any("4 tokens (prefill 0 + decode 4, 3 of them proposed)" in t for t in texts)


def test_each_verification_note_takes_its_own_freed_blocks():
    """The engine verifies every request before rolling any back: each BlockFreed is told in the
    note of its own request's verification, not the latest one."""
    s = initial_state(started(num_blocks=6, block_size=2))
    s = reduce_all(
        s,
        [
            RequestAdded("a", None, 2, 8),
            RequestAdded("b", None, 2, 8),
            SpecTokensVerified(1, "a", (1, 2, 3), 0),
            SpecTokensVerified(1, "b", (1, 2), 2),
            SpecTokensVerified(1, "c", (4, 4), 1),
            BlockFreed("a", 4, 0, False),
            BlockFreed("a", 3, 0, False),
            BlockFreed("c", 5, 0, False),
        ],
    )
    texts = [n.text for n in s.draft.notes]
    assert texts == [
        "a arrives: 2 prompt tokens, first in the waiting queue",
        "b arrives: 2 prompt tokens, at the back of the waiting queue, 1 request ahead",
        "a: proposed 3, accepted 0, rejected 3 (+1 token of its own); blocks 4 3 to the tail",
        "b: proposed 2, accepted 2 + 1 bonus token",
        "c: proposed 2, accepted 1, rejected 1 (+1 token of its own); block 5 to the tail",
    ]


def test_a_masked_step_tells_how_many_tokens_the_grammar_allowed():
    """Structured outputs: a `GrammarMasked` event sets each request's latest counts and tells
    the step in words; a request it does not name keeps its own (None: never masked)."""
    s = initial_state(started(num_blocks=4, block_size=4))
    s = reduce_all(
        s,
        [
            RequestAdded("a", None, 2, 8),
            RequestAdded("b", None, 2, 8),
            BlockAllocated("a", 0, 0),
            BlockAllocated("b", 0, 1),
            RequestScheduled(1, "a", 2, 0, True, False),
            RequestScheduled(1, "b", 2, 0, True, False),
            GrammarMasked(1, {"a": (12,)}, 320),
            TokenEmitted(1, "a", 7, "{", 1),
            TokenEmitted(1, "b", 9, "x", 1),
            summary(1),
        ],
    )
    a, b = s.requests["a"], s.requests["b"]
    assert (a.grammar_allowed, a.vocab_size) == ((12,), 320)
    assert b.grammar_allowed is None
    texts = [n.text for n in s.last_step.notes]
    assert "masked: a grammar allowed 12 of 320 tokens" in texts
    # With proposals to verify, one count per row; the next mask replaces the last.
    s = reduce(s, GrammarMasked(2, {"a": (3, 1, 5), "b": (2,)}, 320))
    assert s.requests["a"].grammar_allowed == (3, 1, 5)
    assert s.requests["b"].grammar_allowed == (2,)
    assert s.draft.notes[-1].text == (
        "masked: a grammar allowed 3/1/5, b grammar allowed 2 of 320 tokens"
    )


def test_children_of_one_parent_are_a_family():
    s = initial_state(started(num_blocks=8))
    s = reduce_all(
        s,
        [RequestAdded(f"{i}_p", None, 5, 4) for i in range(3)]
        + [
            RequestAdded("0_x", None, 5, 4),  # named like a child, but alone
            RequestAdded("2_y", None, 5, 4),  # no 0_y and 1_y before it
            RequestAdded("1_y", None, 5, 4),
        ],
    )
    assert s.families == {"p": ("0_p", "1_p", "2_p")}
    assert family_of(s, "1_p") == ("p", ("0_p", "1_p", "2_p"))
    assert family_of(s, "0_x") is None and family_of(s, "1_y") is None
    assert [n.text for n in s.draft.notes][0] == (
        "p arrives with n=3: children 0_p 1_p 2_p, 5 prompt tokens each, first in the waiting queue"
    )
    # A parent id used again later (after the first family finished) starts a new family.
    s = reduce_all(s, [RequestAdded("0_p", None, 3, 4), RequestAdded("1_p", None, 3, 4)])
    assert s.families["p"] == ("0_p", "1_p")


# --- the committed trace --------------------------------------------------------------------------


def test_trace_shows_every_effect(trace_events):
    kinds = {e.kind for e in trace_events}
    # Only a late subscriber gets a snapshot; the trace has no structured-output request (its
    # masks are checked by hand below, `test_a_masked_step_...`) and no KV connector (its
    # events are checked against an engine that has one, `test_viz_tier.py`).
    # (The P2pConnector's `kv_block_received`: `test_viz_disagg.py`.)
    kv_connector = {
        "kv_block_saved",
        "kv_block_loaded",
        "kv_tier_evicted",
        "kv_load_failed",
        "kv_block_received",
    }
    # (The attention probe's only while the executor panel is open: test_attention_probe.py.)
    expected = set(EVENT_TYPES) - {"engine_snapshot", "grammar_masked", "attention_probed"}
    expected -= {"expert_loads"}  # (a mixture of experts' only: test_viz_moe.py)
    expected -= kv_connector
    assert kinds == expected, expected - kinds
    hits = [e for e in trace_events if isinstance(e, CacheHit)]
    assert any(h.was_free for h in hits) and any(not h.was_free for h in hits)
    assert any(isinstance(e, RequestScheduled) and e.is_chunk for e in trace_events)
    assert any(isinstance(e, RequestFinished) and e.finish_reason == "abort" for e in trace_events)
    verified = [e for e in trace_events if isinstance(e, SpecTokensVerified)]
    assert any(e.num_accepted == len(e.proposed) for e in verified), "all accepted, + a bonus"
    assert any(0 < e.num_accepted < len(e.proposed) for e in verified)
    assert any(e.num_accepted == 0 for e in verified)
    # Blocks that held only rejected proposals, freed right after their verification.
    freed_after_verification = [
        b
        for a, b in zip(trace_events, trace_events[1:])
        if isinstance(a, SpecTokensVerified) and isinstance(b, BlockFreed)
    ]
    assert freed_after_verification
    state = reduce_all(VizState(), trace_events)
    assert any(len(children) == 3 for children in state.families.values()), "a request, n=3"


def test_trace_replay_matches_summaries(trace_events):
    """Every StepSummary's figures agree with the state rebuilt from the events before it."""
    state = VizState()
    checked = 0
    for event in trace_events:
        state = reduce(state, event)
        if isinstance(event, StepSummary):
            fig = kv_figures(state)
            assert len(state.running) == event.num_running
            assert len(state.waiting) == event.num_waiting
            assert fig.num_used_blocks == event.num_used_blocks
            assert fig.num_free_blocks == event.num_free_blocks
            assert fig.num_cached_free_blocks == event.num_cached_free_blocks
            assert fig.num_allocated_slots == event.num_allocated_slots
            assert fig.num_filled_slots == event.num_filled_slots
            assert state.free_queue[: len(event.free_queue_head)] == event.free_queue_head
            assert {s.request_id: s.num_tokens for s in state.last_step.scheduled} == (
                event.scheduled
            )
            checked += 1
    assert checked > 20


def test_reduce_is_pure(trace_events):
    """Replaying twice gives equal states at every point: no reduce mutated an earlier state."""
    states = []
    state = VizState()
    for event in trace_events:
        state = reduce(state, event)
        states.append(state)
    state = VizState()
    for event, kept in zip(trace_events, states):
        state = reduce(state, event)
        assert state == kept
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.step_count = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        state.requests["x"] = None  # type: ignore[index]


# --- robustness: any event sequence ---------------------------------------------------------------

ids = st.sampled_from(["a", "b", "c"])
blocks = st.integers(-1, 6)
hashes = st.sampled_from(["h", "g", "f"])
any_event = st.one_of(
    st.builds(RequestAdded, ids, st.none(), st.integers(1, 9), st.integers(1, 9)),
    st.builds(RequestRejected, ids, st.just("no")),
    st.builds(
        RequestScheduled,
        st.integers(0, 9),
        ids,
        st.integers(1, 9),
        st.integers(0, 9),
        st.booleans(),
        st.booleans(),
    ),
    st.builds(RequestPreempted, st.integers(0, 9), ids, st.integers(0, 9)),
    st.builds(
        TokenEmitted,
        st.integers(0, 9),
        ids,
        st.integers(0, 9),
        st.text(max_size=3),
        st.integers(0, 9),
    ),
    st.builds(
        RequestFinished,
        st.integers(0, 9),
        ids,
        st.just("stop"),
        st.integers(0, 9),
        st.integers(0, 9),
    ),
    st.builds(BlockAllocated, ids, blocks, st.integers(0, 4), st.booleans()),
    st.builds(CacheHit, ids, blocks, st.integers(0, 4), st.booleans(), st.integers(0, 3)),
    st.builds(BlockFreed, ids, blocks, st.integers(0, 2), st.booleans()),
    st.builds(BlockCached, ids, blocks, st.just("h")),
    st.builds(BlockEvicted, blocks, hashes),
    st.builds(
        SpecTokensVerified,
        st.integers(0, 9),
        ids,
        st.lists(st.integers(0, 9), max_size=4).map(tuple),
        st.integers(0, 4),
    ),
    st.builds(
        GrammarMasked,
        st.integers(0, 9),
        st.dictionaries(ids, st.lists(st.integers(0, 9), min_size=1, max_size=4).map(tuple)),
        st.integers(1, 9),
    ),
    st.builds(KVBlockSaved, st.integers(0, 9), blocks, hashes, st.integers(-1, 3)),
    st.builds(KVBlockLoaded, st.integers(0, 9), ids, blocks, hashes, st.integers(-1, 3)),
    st.builds(KVTierEvicted, st.integers(0, 9), hashes, st.integers(-1, 3)),
    st.builds(KVLoadFailed, st.integers(0, 9), ids, st.just("no file")),
    st.integers(0, 9).map(lambda step: summary(step)),
)


@settings(max_examples=examples(60))
@given(st.lists(any_event, max_size=40), st.sampled_from([None, "plain", "tier"]))
def test_reduce_never_raises(events, start):
    """A visualizer draws whatever it gets: a cut or odd trace must not crash the reducer."""
    state = VizState()
    if start == "plain":
        state = initial_state(started(num_blocks=5))
    elif start == "tier":  # a KV connector with a tier of 3 slots
        state = initial_state(
            dataclasses.replace(
                started(num_blocks=5), kv_connector="OffloadingConnector", num_tier_blocks=3
            )
        )
    state = reduce_all(state, events)
    assert state.num_events == len(events)
    assert len(set(state.free_queue)) == len(state.free_queue)
    tier = state.tier
    assert len(set(tier.lru)) == len(tier.lru) and set(tier.lru) <= set(tier.slots)


# --- against the real engine ---------------------------------------------------------------------


@st.composite
def engine_runs(draw):
    """Engine options with a tiny KV cache, and a workload: arrivals, a shared prefix, aborts,
    requests with n > 1, and n-gram speculation two times in three.

    Sized so that the cache is usually too small for everything at once (preemption) and many
    prompts share full blocks (prefix caching); the budget is often below a prompt (chunks).
    Prompts repeat a short motif, so the n-gram proposer finds matches from the start.
    """
    block_size = draw(st.sampled_from([2, 4]))
    config = dict(
        block_size=block_size,
        num_kv_blocks=draw(st.integers(4, 12)),
        max_num_seqs=draw(st.integers(2, 5)),
        max_num_batched_tokens=draw(st.sampled_from([4, 8, 16, 32])),
        enable_prefix_caching=draw(st.sampled_from([True, True, True, False])),
    )
    if draw(st.sampled_from([True, True, False])):
        k = draw(st.integers(1, 4))
        config["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 2,
        }
    shared = list(range(3, 3 + block_size * draw(st.integers(0, 3))))
    motif = st.lists(st.integers(3, 200), min_size=1, max_size=2)
    requests = draw(
        st.lists(
            st.tuples(
                st.integers(0, 6),  # arrival tick
                st.booleans(),  # starts with the shared prefix
                st.tuples(motif, st.integers(1, 10)).map(lambda m: (m[0] * 10)[: m[1]]),
                st.integers(1, 16),  # max_tokens
                st.one_of(st.none(), st.integers(0, 14)),  # abort at tick
                st.sampled_from([1, 1, 1, 2, 3]),  # n
            ),
            min_size=2,
            max_size=6,
        )
    )
    return config, shared, requests


def check_against_engine(state: VizState, engine, since_start: bool = True) -> None:
    """The rebuilt state against the engine. `since_start`: the state saw every event from the
    engine's start (not a snapshot mid-run), so running totals must match too."""
    from nanovllm.request import RequestStatus

    kv, scheduler = engine.kv_cache_manager, engine.scheduler
    assert list(state.free_queue) == [b.block_id for b in kv.free_block_queue.get_all_free_blocks()]
    for block, mine in zip(kv.blocks, state.blocks, strict=True):
        assert mine.ref_count == block.ref_cnt, block
        assert mine.cached == (block.block_hash is not None), block
        assert len(mine.owners) == block.ref_cnt
    assert list(state.running) == [r.request_id for r in scheduler.running]
    live_waiting = [r.request_id for r in scheduler.waiting if r.status != RequestStatus.FINISHED]
    assert list(state.waiting) == live_waiting
    assert len(state.waiting) == scheduler.num_waiting
    for rid, request in scheduler.requests.items():
        mine = state.requests[rid]
        assert list(mine.block_table) == kv.get_block_table(rid), rid
        assert mine.num_computed_tokens == request.num_computed_tokens, rid
        assert mine.num_output_tokens == request.num_output_tokens, rid
    fig = kv_figures(state)
    assert fig.num_used_blocks == kv.num_used_blocks
    assert fig.num_free_blocks == kv.num_free_blocks
    assert fig.num_cached_free_blocks == kv.block_pool.num_cached_free_blocks
    assert fig.num_allocated_slots == num_allocated_slots(kv)
    assert fig.num_filled_slots == num_filled_slots(kv)
    assert state.metrics.num_preemptions == scheduler.num_preemptions
    assert state.metrics.prefix_hits == scheduler.prefix_cache_hits
    assert state.metrics.prefix_queries == scheduler.prefix_cache_queries
    for parent in engine.output_processor.parent_requests.values():
        children = tuple(c.request_id for c in parent.children)
        assert family_of(state, children[-1]) == (parent.request_id, children)
    if since_start:
        spec, m = engine.stats.spec_decoding, state.metrics
        assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (
            spec.num_drafts,
            spec.num_draft_tokens,
            spec.num_accepted_tokens,
        )


@pytest.mark.quick
@settings(max_examples=examples(25))
@given(run=engine_runs())
def test_reducer_agrees_with_engine(tiny_llama: Path, run):
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.engine.parallel_sampling import child_request_id
    from nanovllm.sampling_params import SamplingParams

    config, shared, requests = run
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), num_threads=1, **config))
    box = [VizState()]
    engine.subscribe(lambda event: box.__setitem__(0, reduce(box[0], event)))
    params = [
        SamplingParams(temperature=0, max_tokens=r[3], ignore_eos=True, n=r[5]) for r in requests
    ]
    added: set[str] = set()
    for tick in range(200):  # (it stops once every request is done)
        for i, (arrival, use_shared, prompt, _, abort_at, n) in enumerate(requests):
            rid = f"q{i}"
            if arrival == tick:
                try:
                    engine.add_request(rid, (shared if use_shared else []) + prompt, params[i])
                    added.update([rid] if n == 1 else (child_request_id(rid, j) for j in range(n)))
                except ValueError:
                    pass  # too big for this KV cache: a RequestRejected event
            parents = engine.output_processor.parent_requests
            live = rid in engine.scheduler.requests or rid in parents
            if abort_at == tick and live:
                engine.abort_request(rid)
                check_against_engine(box[0], engine)
        if engine.has_unfinished_requests():
            engine.step()
            check_against_engine(box[0], engine)
        elif tick > 12:
            break
    state = box[0]
    note(f"preempted: {state.metrics.num_preemptions > 0}")
    note(f"prefix hits: {state.metrics.prefix_hits > 0}")
    note(f"chunks: {any(CHUNK in c.cells.values() for c in state.timeline)}")
    note(f"proposals accepted: {state.metrics.num_accepted_tokens > 0}")
    note(f"families: {bool(state.families)}")
    assert not engine.has_unfinished_requests()
    assert state.running == () and state.waiting == ()
    assert set(state.finished) == added


def test_reducer_agrees_with_engine_on_planned_workload(tiny_llama: Path):
    """The trace's workload, checked step by step: preemption, prefix hits, chunks, an abort."""
    from make_viz_trace import record_trace

    box = {"state": VizState(), "seen": 0, "checks": 0}

    def check(engine, events: list) -> None:
        box["state"] = reduce_all(box["state"], events[box["seen"] :])
        box["seen"] = len(events)
        check_against_engine(box["state"], engine)
        box["checks"] += 1

    record_trace(tiny_llama, check=check)
    state = box["state"]
    assert box["checks"] > 30
    assert state.metrics.num_preemptions > 0 and state.metrics.prefix_hits > 0
    assert state.metrics.num_rejected == 1
    assert 0 < state.metrics.num_accepted_tokens < state.metrics.num_draft_tokens


def test_snapshot_mid_run_then_events_agree_with_engine(tiny_llama: Path):
    """A viewer that joins mid-run: `EngineStarted`, then `engine_snapshot` (through JSON),
    then the events that follow, must agree with the engine at every later step."""
    import json

    from make_viz_trace import record_trace

    from nanovllm.events import event_from_dict, event_to_dict

    box = {"state": None, "seen": 0, "checks": 0}

    def check(engine, events: list) -> None:
        if box["state"] is None:
            if len(events) < 120:  # join once blocks are cached and requests are running
                return
            wire = json.loads(json.dumps(event_to_dict(snapshot_now(engine))))
            box["state"] = reduce_all(VizState(), [engine.started_event, event_from_dict(wire)])
            box["seen"] = len(events)
        box["state"] = reduce_all(box["state"], events[box["seen"] :])
        box["seen"] = len(events)
        check_against_engine(box["state"], engine, since_start=False)
        box["checks"] += 1

    record_trace(tiny_llama, check=check)
    assert box["checks"] > 20


def snapshot_now(engine):
    """The engine's state now, as a subscriber that joins now receives it after `EngineStarted`."""
    told = []
    engine.subscribe(told.append, snapshot=True)()  # (and unsubscribed at once)
    return told[1]
