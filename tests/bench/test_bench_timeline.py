"""`nanovllm bench --async-scheduling --timeline`: the plain loop's timeline, read from the
engine's per-step statistics (`engine/stats.py`), is each step's parts in order, one step after
another, within the run, and as many steps as the engine ran."""

from __future__ import annotations

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.bench import async_scheduling
from nanovllm.bench.models import resolve


@pytest.mark.parametrize("mode", ["plain", "async"])
def test_the_timeline_is_each_steps_parts_in_order(mode: str) -> None:
    llm = LLM(resolve("micro").path, dtype="float32", async_scheduling=mode == "async")
    prompts = [{"prompt_token_ids": list(range(1, 6 + i))} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    steps_before = llm.llm_engine.stats.num_steps
    steps = async_scheduling.record_timeline(llm, prompts, params)
    assert len(steps) == llm.llm_engine.stats.num_steps - steps_before > 0
    previous_end = 0.0 if mode == "plain" else float("-inf")
    for step in steps:
        parts = [step[p] for p in ("schedule", "inputs", "forward", "outputs") if p in step]
        for start, end in parts:
            assert 0.0 <= start <= end
        if mode == "plain":  # one part after another, one step after another
            flat = [t for span in parts for t in span]
            assert flat == sorted(flat), step
            assert parts[0][0] >= previous_end - 1e-6
            previous_end = parts[-1][1]
