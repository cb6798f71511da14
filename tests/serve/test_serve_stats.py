"""The per-request timeline (serve/stats.py) on a real engine's schedule, with a fake clock.

Step k runs from time k to k + 0.5, so every interval is known by hand from the schedule:
one sequence at a time (max_num_seqs=1) and a 16-token budget, so request a's 40-token prompt
is prefilled in three chunks (steps 1-3) and request b waits until a has finished.
"""

from __future__ import annotations

import pytest

from nanovllm import EngineConfig, LLMEngine, SamplingParams
from nanovllm.engine.outputs import CompletionOutput, RequestOutput
from nanovllm.serve.stats import RequestTimer


def test_timeline_follows_chunked_prefill_and_queueing(model_path):
    engine = LLMEngine(
        EngineConfig(model=str(model_path), max_num_batched_tokens=16, max_num_seqs=1)
    )
    timer = RequestTimer()
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for request_id, arrival, prompt in (("a", 0.0, list(range(3, 43))), ("b", 0.25, [3, 4, 5])):
        request = engine.add_request(request_id, prompt, params)
        timer.add(request_id, arrival, request.num_prompt_tokens)
    ttfts, itls, finished = [], [], {}
    step = 0
    while engine.has_unfinished_requests():
        step += 1
        outputs = engine.step()
        stats = timer.step(float(step), step + 0.5, engine.scheduler.running, outputs)
        ttfts += stats.time_to_first_tokens
        itls += stats.inter_token_latencies
        for output, summary in zip(
            [o for o in outputs if o.finished], stats.finished_requests, strict=True
        ):
            finished[output.request_id] = summary
    assert step == 8  # a: 3 prefill chunks + 2 decodes; b: 1 prefill + 2 decodes
    a, b = finished["a"], finished["b"]
    # a: scheduled at 1 (its first chunk), first token at the end of step 3, last of step 5.
    assert (a.queued_time, a.prefill_time, a.decode_time, a.e2e_latency) == (1.0, 2.5, 2.0, 5.5)
    # b: waits for a's slot until step 6.
    assert (b.queued_time, b.prefill_time, b.decode_time) == (5.75, 0.5, 2.0)
    assert b.e2e_latency == pytest.approx(8.25)
    assert ttfts == [3.5, 6.25]
    assert itls == [1.0] * 4
    assert (a.num_prompt_tokens, a.num_generation_tokens, a.finish_reason) == (40, 3, "length")
    assert (b.num_prompt_tokens, b.num_generation_tokens) == (3, 3)


def test_an_aborted_request_is_not_summarised(model_path):
    engine = LLMEngine(EngineConfig(model=str(model_path), num_kv_blocks=8))
    timer = RequestTimer()
    engine.add_request("x", [3, 4, 5], SamplingParams(max_tokens=5))
    timer.add("x", 0.0, 3)
    stats = timer.step(1.0, 1.5, engine.scheduler.running, engine.step())
    assert stats.time_to_first_tokens == [1.5]
    engine.abort_request("x")
    timer.forget("x")
    stats = timer.step(2.0, 2.5, engine.scheduler.running, engine.step())
    assert not stats


def test_a_request_that_ends_without_a_token_is_forgotten():
    """An error can end a request before its first token, or with none in its last output:
    its timeline must go with it, or a server's timer grows with every such request."""
    timer = RequestTimer()

    def output(request_id: str, new: list[int], finish: str | None) -> RequestOutput:
        done = CompletionOutput(0, "", new, finish_reason=finish, delta_token_ids=new)
        return RequestOutput(request_id, None, [3], [done], finished=finish is not None)

    for i in range(100):
        timer.add(f"early-{i}", 0.0, 1)
        timer.add(f"late-{i}", 0.0, 1)
        timer.step(1.0, 1.5, [], [output(f"late-{i}", [7], None)])
        stats = timer.step(2.0, 2.5, [], [output(f"early-{i}", [], "error"),
                                          output(f"late-{i}", [], "error")])  # fmt: skip
        assert [f.num_generation_tokens for f in stats.finished_requests] == [1]
    assert len(timer) == 0
