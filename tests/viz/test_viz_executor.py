"""The executor panel's figures against the engine's own step inputs, and why requests wait.

The oracle of the executor panel is the model runner itself: a spy on its `prepare_inputs`
keeps the very tensors it hands the model (and the scheduler's decision it got), and every
figure the panel's state shows (positions, slots, query starts, context lengths, block tables,
sampled rows, sampled tokens) must equal them, step after step, through chunked prefill and
preemption. The waiting reasons are checked against the scheduler's state, recorded by a spy on
`schedule` at the moment it decided.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from budget import examples
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from nanovllm.events import (
    WAITING_REASONS,
    AttentionComputed,
    KVWritten,
    LogitsComputed,
    StepInputsPrepared,
    StepSummary,
    TokensSampled,
    event_from_dict,
    event_to_dict,
)
from nanovllm.viz.executor import SAMPLED, STAGES, block_reads, request_spans, token_columns
from nanovllm.viz.state import VizState, reduce
from nanovllm.viz.waiting import NEW, why_waiting

EXECUTOR_KINDS = [StepInputsPrepared, KVWritten, AttentionComputed, LogitsComputed, TokensSampled]


class Spy:
    """The engine's own figures of each step: what `prepare_inputs` returned, what the scheduler
    decided and the scheduler's state right after it decided."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.inputs: list = []  # (SchedulerOutput, inputs) per step
        self.decisions: list = []  # (SchedulerOutput, scheduler state at the decision)
        runner, scheduler = engine.runner, engine.scheduler
        prepare, schedule = runner.prepare_inputs, scheduler.schedule

        def spy_prepare(out):
            inputs = prepare(out)
            self.inputs.append((out, inputs))
            return inputs

        def spy_schedule():
            out = schedule()
            kv = engine.kv_cache_manager
            live = [r for r in scheduler.waiting if r.status.name != "FINISHED"]
            head = live[0] if live else None
            self.decisions.append(
                (
                    out,
                    dict(
                        num_running=len(scheduler.running),
                        num_free_blocks=kv.num_free_blocks,
                        head=head.request_id if head else None,
                        head_tokens=head.num_tokens if head else 0,
                        waiting=[r.request_id for r in live],
                    ),
                )
            )
            return out

        runner.prepare_inputs = spy_prepare
        scheduler.schedule = spy_schedule


def check_panel(state: VizState, spy: Spy, block_size: int, sampled: dict[str, int]) -> None:
    """Every figure of the panel's state equals the runner's own inputs of the last step."""
    out, (input_ids, positions, meta, logits_rows) = spy.inputs[-1]
    ex = state.executor
    assert ex is not None and ex.step == out.step and ex.stage == SAMPLED
    columns = token_columns(ex.inputs)
    assert [c.token_id for c in columns] == input_ids.tolist()
    assert [c.position for c in columns] == positions.tolist()
    assert [c.slot for c in columns] == meta.slot_mapping.tolist()
    tables = meta.block_tables.tolist()
    for c in columns:  # `block·size+offset` is the block its request's table maps it to
        i = [s.request.request_id for s in out.scheduled].index(c.request_id)
        assert c.block == tables[i][c.position // block_size]
        assert c.offset == c.position % block_size
    spans = request_spans(ex.inputs)
    assert [s.request_id for s in spans] == [s.request.request_id for s in out.scheduled]
    assert [s.query_start for s in spans] == list(meta.query_start_list[:-1])
    assert [s.query_len for s in spans] == list(meta.query_lens_list)
    assert [s.seq_len for s in spans] == list(meta.seq_lens_list)
    for span, row in zip(spans, tables):
        reads = block_reads(span, block_size)
        assert [b for _, b, _ in reads] == row[: len(reads)]
        assert sum(n for _, _, n in reads) == span.seq_len
    # Sampled rows: those the runner computes logits for; a chunk short of its prompt has none.
    assert [c.row for c in columns if c.sampled] == list(logits_rows)
    assert [s.samples for s in spans] == [s.samples for s in out.scheduled]
    for s in out.scheduled:
        if not s.samples:
            assert s.num_computed_tokens + s.num_new_tokens < s.request.num_tokens
    # The sampled tokens are the ones the requests received.
    assert {rid: t[-1] for rid, t in ex.sampled} == sampled


def check_waiting(state: VizState, spy: Spy, config: dict) -> str | None:
    """Every waiting request has a reason, the scheduler's, true of its state when it decided."""
    out, at = spy.decisions[-1]
    live = [r.request_id for r in spy.engine.scheduler.waiting if r.status.name != "FINISHED"]
    assert list(state.waiting) == live
    for rid in state.waiting:
        why = why_waiting(state, rid)
        assert why is not None and why[0] != NEW, rid
        assert state.waiting_reason in WAITING_REASONS
    if not live:
        return None
    reason = state.waiting_reason
    assert state.waiting_head == at["head"] == live[0]
    budget = config["max_num_batched_tokens"]
    if reason == "preempted":
        assert out.preempted
    elif reason == "max_num_seqs":
        assert at["num_running"] == config["max_num_seqs"]
    elif reason == "token_budget":
        left = budget - out.num_scheduled_tokens
        chunked = config.get("enable_chunked_prefill", True)
        assert left == 0 or (not chunked and at["head_tokens"] > left)
    else:  # no free block for the head's tokens (no prefix caching here: it needs them all)
        assert reason == "no_free_block"
        left = budget - out.num_scheduled_tokens  # (unchunked, the whole prompt fit in it)
        needed = -(-min(at["head_tokens"], left) // config["block_size"])
        assert needed > at["num_free_blocks"]
        # Both counts, each said with when it was true: requests finishing in the step free
        # blocks after the scheduler decided.
        summary = state.last_step.summary
        free_now = spy.engine.kv_cache_manager.num_free_blocks
        assert summary.waiting_blocks_needed == needed
        assert summary.waiting_free_blocks == at["num_free_blocks"]
        words = (
            f"when the scheduler decided: {at['num_free_blocks']} free, {needed} needed; "
            f"after the step: {free_now} free"
        )
        assert any(words in n.text for n in state.last_step.notes), words
        assert words in why_waiting(state, at["head"])[1]
    return reason


def run(tiny_llama: Path, config: dict, prompts: list[list[int]], max_tokens: int) -> set:
    """Serve `prompts`, checking the panel and the waiting reasons after every step."""
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(tiny_llama), num_threads=1, **config))
    spy = Spy(engine)
    box = [VizState()]
    events: list = []

    def on_event(event) -> None:
        # Through JSON, as --record/--replay and the server's event stream carry it.
        event = event_from_dict(json.loads(json.dumps(event_to_dict(event))))
        events.append(event)
        box[0] = reduce(box[0], event)

    engine.subscribe(on_event)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    reasons = set()
    chunks = 0
    for _ in range(300):
        if not engine.has_unfinished_requests():
            break
        outputs = engine.step()
        sampled = {o.request_id: o.outputs[0].token_ids[-1] for o in outputs if o.outputs}
        check_panel(box[0], spy, config["block_size"], sampled)
        reasons.add(check_waiting(box[0], spy, config))
        chunks += sum(not s.samples for s in spy.inputs[-1][0].scheduled)
    assert not engine.has_unfinished_requests()
    kinds = [type(e) for e in events if type(e) in EXECUTOR_KINDS]
    assert kinds == EXECUTOR_KINDS * (len(kinds) // 5)  # the stages in the engine's order
    assert len(STAGES) == 5
    preempted = {"preemption"} if engine.scheduler.num_preemptions else set()
    return reasons | ({"chunk"} if chunks else set()) | preempted


def test_panel_and_waiting_reasons_along_a_trace(tiny_llama: Path):
    """A planned run where every reason happens: max_num_seqs full, the budget spent, no free
    block, a preemption; and chunks the budget cut."""
    config = dict(
        block_size=4,
        num_kv_blocks=14,
        max_num_seqs=3,
        max_num_batched_tokens=12,
        enable_prefix_caching=False,
    )
    prompts = [list(range(3 + i, 3 + i + n)) for i, n in enumerate([20, 5, 6, 7, 30, 4, 9])]
    seen = run(tiny_llama, config, prompts, max_tokens=14)
    assert {"max_num_seqs", "token_budget", "no_free_block", "preempted", "chunk"} <= seen, seen


@settings(max_examples=examples(12), deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    chunked=st.booleans(),
    kv_tokens=st.integers(24, 96),  # the KV cache in tokens: tiny ones preempt
    budget=st.sampled_from([8, 16, 32]),
    max_num_seqs=st.integers(1, 4),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=5),
    max_tokens=st.integers(1, 16),
)
def test_panel_equals_the_engines_step_inputs(
    tiny_llama: Path, block_size, chunked, kv_tokens, budget, max_num_seqs, lengths, max_tokens
):
    """Block size, chunked prefill on or off, a KV cache from roomy to tiny (preemption)."""
    num_kv_blocks = max(2, kv_tokens // block_size)
    capacity = num_kv_blocks * block_size
    extra = {}
    if not chunked:  # without chunking, a whole request (recomputed too) must fit one step
        max_tokens = min(max_tokens, budget // 2)
        lengths = [min(n, budget - max_tokens) for n in lengths]
        extra["max_model_len"] = budget
    lengths = [min(n, capacity - max_tokens) for n in lengths]  # each fits the cache alone
    if min(lengths) < 1:
        return
    config = dict(
        **extra,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=False,
    )
    prompts = [list(range(3 + i, 3 + i + n)) for i, n in enumerate(lengths)]
    seen = run(tiny_llama, config, prompts, max_tokens)
    note(f"seen: {sorted(r for r in seen if r)}")
    for what in sorted(r for r in seen if r):
        event(what)


def test_no_subscriber_no_executor_events(tiny_llama: Path):
    """With nobody subscribed the step builds no event: the wrapper only reads `active`."""
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.executor import step_events
    from nanovllm.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(tiny_llama), num_threads=1, block_size=4))
    calls = []
    real = step_events.executor_events
    step_events.executor_events = lambda *a: calls.append(a) or real(*a)
    try:
        engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
        engine.run_until_done()
        assert calls == []
        got = []
        engine.subscribe(got.append)
        engine.add_request("b", [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
        engine.run_until_done()
        assert len(calls) == 3 and sum(isinstance(e, StepInputsPrepared) for e in got) == 3
    finally:
        step_events.executor_events = real


def test_the_event_stream_carries_the_executor_events():
    """The server's `/events` SSE encoding and `--connect`'s decoding keep every field."""
    from nanovllm.serve.event_stream import _sse

    inputs = StepInputsPrepared(
        step=3,
        block_size=4,
        request_ids=("a", "b"),
        input_ids=(5, 6, 7),
        positions=(4, 5, 9),
        slot_mapping=(8, 9, 29),
        query_start_loc=(0, 2, 3),
        seq_lens=(6, 10),
        block_tables=((0, 2), (1, 3, 7)),
        logits_rows=(1, 2),
        num_sampled_rows=2,
    )
    summary = StepSummary(
        3, {"a": 2}, 2, 1, 2, 1, 4, 0, 4, 16, 10, 0.0, 0.0,
        waiting_reason="no_free_block", waiting_head="c", budget_cut={"a": 5},
    )  # fmt: skip
    for sent in (
        inputs,
        KVWritten(3, (8, 9, 29), 2),
        AttentionComputed(3, ("a", "b"), (6, 10), "torch"),
        LogitsComputed(3, (1, 2), 320),
        TokensSampled(3, ("a", "b"), ((7,), (9, 11))),
        summary,
    ):
        line = _sse(event_to_dict(sent))
        assert line.startswith("data: ")
        assert event_from_dict(json.loads(line[len("data: ") :])) == sent


@pytest.mark.parametrize("size", [(160, 48)])
def test_the_panel_draws_the_figures(trace_path: Path, size):
    """At 160x48 the panel (opened as a lesson opens it) shows the step's slots as
    `block·size+offset`, each request's query start and context, attention's block reads and
    the logits rows, equal to the trace's `StepInputsPrepared`."""
    import asyncio

    from nanovllm.viz.app import VizApp, screen_text
    from nanovllm.viz.driver import ReplayDriver
    from nanovllm.viz.trace import read_trace
    from nanovllm.viz.widgets import ExecutorView

    events = read_trace(trace_path)
    step = 3
    inputs = next(e for e in events if isinstance(e, StepInputsPrepared) and e.step == step)

    async def shoot() -> str:
        app = VizApp(
            lambda publish, notify: ReplayDriver(
                events, publish, notify=notify, paused=False, speed=0, max_steps=step
            ),
            panel="executor",
        )
        async with app.run_test(size=size) as pilot:
            for _ in range(200):
                await pilot.pause(0.02)
                if app.state.step >= step:
                    break
            await pilot.pause(0.1)
            assert app.query_one(ExecutorView).display
            return screen_text(app)

    text = asyncio.run(shoot())
    spans = request_spans(inputs)
    first = spans[0]
    assert f"q@{first.query_start} ×{first.query_len} ctx {first.seq_len}" in text
    for c in token_columns(inputs)[:3]:
        assert f"{c.block}·{inputs.block_size}+{c.offset}" in text
    reads = block_reads(first, inputs.block_size)
    assert f"L0→#{reads[0][1]}[{reads[0][2]}]" in text
    assert "logits [" in text and " ".join(map(str, inputs.logits_rows)) in text


@pytest.mark.parametrize("lesson", ["4", "9"])
def test_lessons_open_on_the_executor_panel(lesson, tmp_path, monkeypatch, capsys):
    """`nanovllm lesson 4 --viz` (attention reading scattered blocks) and `lesson 9 --viz` (a
    chunk beside decodes in one flat batch) open paused at their moment, on the executor
    panel, showing that step's flat batch."""
    from nanovllm.lessons.cli import main

    monkeypatch.setenv("NANOVLLM_HOME", str(tmp_path))
    shot = tmp_path / "moment.txt"
    assert main([lesson, "--viz", "--screenshot", str(shot)]) == 0
    out = capsys.readouterr().out
    step = int(out.split("paused after step ")[1].split(":")[0])
    screen = shot.read_text()
    assert "Model executor" in screen and f"step {step} ▸inputs" in screen
    if lesson == "4":
        assert "⇢" in screen  # the selected request's reads hop over its blocks
    else:
        assert "chunk" in screen and "flat batch" in screen


def test_kv_writes_light_their_slots_and_blocks(trace_events):
    """While `KVWritten` is the latest event, its slots light up (paging diagram) and so do
    their blocks (KV grid); the next stage puts them out."""
    from nanovllm.viz.executor import written_slots
    from nanovllm.viz.state import latest_changes

    state = VizState()
    i = next(i for i, e in enumerate(trace_events) if isinstance(e, KVWritten))
    for e in trace_events[: i + 1]:
        state = reduce(state, e)
    written, size = trace_events[i], state.block_size
    assert written_slots(state.draft.events) == set(written.slot_mapping)
    assert latest_changes(state).blocks == {s // size for s in written.slot_mapping}
    state = reduce(state, trace_events[i + 1])  # attention
    assert isinstance(trace_events[i + 1], AttentionComputed)
    assert written_slots(state.draft.events) == frozenset()


def test_brackets_page_the_flat_batch(trace_events):
    """At 80x24 the footer offers `[ ]` with the panel open, and `]` / `[` show the flat
    batch's next / previous page of rows (issue 53: a prefill's every token is reachable)."""
    import asyncio
    import re

    from nanovllm.viz.app import VizApp, screen_text
    from nanovllm.viz.driver import ReplayDriver

    step = next(
        e.step for e in trace_events if isinstance(e, StepInputsPrepared) and len(e.input_ids) > 8
    )

    def rows(text: str) -> tuple[int, int]:
        found = re.search(r"flat batch: \d+ tokens · rows (\d+)-(\d+)", text)
        assert found, text
        return int(found[1]), int(found[2])

    async def go() -> list[str]:
        app = VizApp(
            lambda publish, notify: ReplayDriver(
                trace_events, publish, notify=notify, paused=False, speed=0, max_steps=step
            ),
            panel="executor",
        )
        screens = []
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(200):
                await pilot.pause(0.02)
                if app.state.step >= step and app.status and app.status.paused:
                    break
            await pilot.pause(0.1)
            screens.append(screen_text(app))
            for key in ("right_square_bracket", "left_square_bracket"):
                await pilot.press(key)
                await pilot.pause(0.05)
                screens.append(screen_text(app))
        return screens

    first, paged, back = asyncio.run(go())
    assert "[ ] page" in first.splitlines()[-1]
    assert rows(paged)[0] == rows(first)[1] + 1 or rows(paged)[1] > rows(first)[1]
    assert rows(back) == rows(first)
