"""The executor panel's words beyond the executor's figures: the sampled tokens' text beside
their ids, and why there is no step to show.

Oracles: the engine's own output text (each step's new text is the text of the tokens it
sampled, in order), the committed trace's `TokenEmitted` lines read as plain JSON, and the
screen of the app replaying that trace.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from viz_helpers import wait_until

from nanovllm.viz.app import VizApp, screen_text
from nanovllm.viz.driver import DriverStatus, ReplayDriver
from nanovllm.viz.executor_text import no_step_words, sampled_texts
from nanovllm.viz.state import VizState, reduce


def test_sampled_text_is_the_engines_new_output_text(tiny_llama: Path):
    """Along a live run with chunks and several requests: the texts of the tokens each request
    sampled in a step, joined, are exactly the text its output grew by in that step."""
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    config = EngineConfig(
        model=str(tiny_llama), num_threads=1, block_size=4, num_kv_blocks=32,
        max_num_batched_tokens=16,
    )  # fmt: skip
    engine = LLMEngine(config)
    box = [VizState()]
    engine.subscribe(lambda e: box.__setitem__(0, reduce(box[0], e)))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for i, n in enumerate([5, 19, 9]):
        engine.add_request(f"r{i}", list(range(7 + i, 7 + i + n)), params)
    texts: dict[str, str] = {}
    checked = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        ex = box[0].executor
        assert ex is not None
        sampled = dict(ex.sampled)
        for o in outputs:
            new = o.outputs[0].text[len(texts.get(o.request_id, "")) :]
            texts[o.request_id] = o.outputs[0].text
            got = sampled_texts(box[0], ex.step, o.request_id, sampled[o.request_id])
            assert None not in got and "".join(got) == new, (o.request_id, got, new)
            checked += 1
    assert checked >= 18  # 3 requests × 6 tokens


def test_live_run_at_step_zero_says_so():
    live = DriverStatus(mode="live", source="model")
    words = no_step_words(VizState(), live)
    assert "first step has not built its inputs" in words and "trace" not in words


def test_panel_shows_sampled_text_and_step_zero(trace_path: Path):
    emitted = [
        json.loads(line)
        for line in trace_path.read_text().splitlines()
        if '"token_emitted"' in line
    ]
    step4 = [e for e in emitted if e["step"] == 4]
    assert step4

    def make(publish, notify):
        return ReplayDriver(trace_path, publish, notify=notify, paused=True, speed=16)

    async def go():
        app = VizApp(make, panel="executor")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.status is not None and not app.status.loading)
            await pilot.pause(0.1)
            assert "the first step has not built its inputs" in screen_text(app)
            for n in range(1, 5):
                await pilot.press("s")
                await wait_until(pilot, lambda n=n: app.state.step == n)
            await pilot.pause(0.2)
            text = screen_text(app)
            for e in step4:  # id and text, as the story quotes it
                assert f"{e['token_id']} {e['text_delta']!r}" in text, e

    asyncio.run(go())
