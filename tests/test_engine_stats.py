"""`LLMEngine.stats` (`engine/stats.py`): one step's figures and the totals, against what the
requests themselves report.

The oracles are independent of the statistics code: the tokens each request was served from the
prefix cache (`RequestOutput.num_cached_tokens`), the tokens the steps must have computed (each
prompt less its cached tokens, plus every output token but the last), and the steps `step()`
ran, counted by the caller.
"""

from __future__ import annotations

from nanovllm.config import EngineConfig
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.sampling_params import SamplingParams


def test_the_stats_add_up_to_what_the_requests_report(tiny_llama) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, max_num_batched_tokens=16))
    prompt = list(range(1, 14))  # 13 tokens: 3 full blocks to share
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    finals, steps_ran, per_step = {}, 0, []
    for i in range(3):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt + [20 + i]}, params)
        while engine.has_unfinished_requests():
            before = engine.stats.num_steps
            for out in engine.step():
                if out.finished:
                    finals[out.request_id] = out
            if engine.stats.num_steps > before:
                steps_ran += 1
                per_step.append(engine.stats.last)
    stats = engine.stats
    assert stats.num_steps == steps_ran == len(per_step)
    assert [s.step for s in per_step] == sorted({s.step for s in per_step})
    cached = sum(o.num_cached_tokens for o in finals.values())
    assert cached > 0, "no prefix-cache hit: a vacuous run"
    assert stats.prefix_cache_hits == sum(s.prefix_cache_hits for s in per_step) == cached
    assert stats.prefix_cache_queries == sum(s.prefix_cache_queries for s in per_step) == 3 * 14
    computed = sum(
        14 - o.num_cached_tokens + len(o.outputs[0].token_ids) - 1 for o in finals.values()
    )
    assert sum(s.num_scheduled_tokens for s in per_step) == computed
    assert all(0 < s.num_scheduled_tokens <= 16 for s in per_step)
    assert abs(stats.forward_time - sum(s.forward_time for s in per_step)) < 1e-9
    assert all(0 <= s.prepare_time <= s.forward_time for s in per_step)
    assert stats.num_preemptions == 0 and stats.external_prefix_cache_hits == 0


def test_the_live_figures_are_the_queues_and_blocks_of_the_moment(tiny_llama) -> None:
    """`stats.live` (what bench, serve and the stress tool read) against the scheduler's queues
    and the KV cache manager's counts, between steps, an abort included."""
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, max_num_seqs=2))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", {"prompt_token_ids": list(range(1, 10 + i))}, params)
    live, scheduler, kv = engine.stats.live, engine.scheduler, engine.kv_cache_manager
    seen_running = False
    while engine.has_unfinished_requests():
        assert live.request_ids == tuple(scheduler.requests)
        assert live.running == tuple(scheduler.running) and live.num_running == len(live.running)
        assert live.num_waiting == scheduler.num_waiting
        assert (live.num_free_blocks, live.num_used_blocks) == (
            kv.num_free_blocks,
            kv.num_used_blocks,
        )
        assert live.num_allocated_slots == kv.num_used_blocks * 4 >= live.num_filled_slots
        seen_running |= live.num_running == 2
        if engine.stats.num_steps == 2:
            engine.abort_request("r2")  # (waiting: max_num_seqs=2)
        engine.step()
    assert seen_running and live.request_ids == () and live.num_used_blocks == 0
    assert live.num_free_blocks == live.num_blocks == engine.num_kv_blocks
