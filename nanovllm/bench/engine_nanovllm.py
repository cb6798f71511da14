"""nanovllm under test: `LLMEngine.step()` in a loop, every step timed and measured.

The adapter drives the engine the way `LLM.generate` does (all requests in, step until done),
or, for an online workload, adds each request when its arrival time has passed. Each token's
time is taken when `step()` returns it.

Per step it also records what the engine already measures (`last_schedule_time`, the runner's
forward and sample times, the KV cache's allocated and filled slots) plus one figure the engine
does not separate: the time to build the step's input tensors. For that the adapter wraps this
engine instance's `runner.prepare_inputs` with a timer (two `perf_counter` calls a step), which
also records the step's shape (tokens, prefill tokens, sequences, sampled rows) for the
linear-layer floor. It does not subscribe to the event bus: with a subscriber the engine builds
an event for every block operation, which would inflate the very overhead being measured.

Between runs the prefix cache is emptied, so a repeat does not find the previous repeat's
prompts already cached.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from nanovllm.bench.engine_base import TokenCallback, wait_until
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.workload import Workload


@dataclass
class StepRecord:
    """One engine step, as the bench saw it. Times in seconds."""

    t_end: float  # since run start
    wall: float  # the whole step() call
    schedule: float
    prepare: float  # building input tensors (inside the runner's forward time)
    model: float  # the forward pass and the logits
    sample: float
    num_tokens: int
    num_prefill_tokens: int
    num_seqs: int
    num_sampled: int
    num_running: int
    num_waiting: int
    allocated_slots: int
    filled_slots: int


class NanovllmEngine:
    def __init__(self, model_path: str, name: str = "nanovllm", **engine_options) -> None:
        self.name = name
        self.model_path = model_path
        self.options = engine_options
        self.engine = None
        self._runs = 0

    def load(self) -> dict:
        from nanovllm.config import EngineConfig
        from nanovllm.engine.llm_engine import LLMEngine

        self.engine = LLMEngine(EngineConfig(model=self.model_path, **self.options))
        self._instrument()
        e = self.engine
        per_block = e.runner.kv_bytes_per_block(e.model_args, e.config.block_size, e.dtype)
        return {
            "num_kv_blocks": e.num_kv_blocks,
            "kv_cache_bytes": per_block * e.num_kv_blocks,
            "block_size": e.config.block_size,
            "max_model_len": e.max_model_len,
            "max_num_seqs": e.config.max_num_seqs,
            "max_num_batched_tokens": e.config.max_num_batched_tokens,
            "enable_prefix_caching": e.config.enable_prefix_caching,
            "attention_backend": e.attention_backend,
        }

    def _instrument(self) -> None:
        runner = self.engine.runner
        inner = runner.prepare_inputs
        self._prep: tuple = (0.0, 0, 0, 0, 0)

        def timed_prepare_inputs(out):
            start = time.perf_counter()
            result = inner(out)
            prefill = sum(s.num_new_tokens for s in out.scheduled if s.is_prefill)
            self._prep = (
                time.perf_counter() - start,
                out.num_scheduled_tokens,
                prefill,
                len(out.scheduled),
                sum(1 for s in out.scheduled if s.samples),
            )
            return result

        runner.prepare_inputs = timed_prepare_inputs  # this instance only

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        from nanovllm.sampling_params import SamplingParams

        engine = self.engine
        engine.kv_cache_manager.reset_prefix_cache()
        self._runs += 1
        prefix = f"r{self._runs}-"
        sched = engine.scheduler
        hits0, queries0, preempt0 = (
            sched.prefix_cache_hits,
            sched.prefix_cache_queries,
            sched.num_preemptions,
        )
        params = [
            SamplingParams(
                temperature=workload.temperature,
                top_p=workload.top_p,
                max_tokens=r.max_tokens,
                ignore_eos=True,
                seed=r.seed,
            )
            for r in workload.requests
        ]
        requests = workload.requests
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        tokens: list[list[int]] = [[] for _ in requests]
        times: list[list[float]] = [[] for _ in requests]
        steps: list[StepRecord] = []
        kv = engine.kv_cache_manager
        runner = engine.runner
        nxt = 0
        start = time.perf_counter()
        while nxt < len(order) or engine.has_unfinished_requests():
            now = time.perf_counter() - start
            while nxt < len(order) and requests[order[nxt]].arrival_s <= now:
                i = order[nxt]
                engine.add_request(f"{prefix}{i}", requests[i].prompt_token_ids, params[i])
                nxt += 1
            if not engine.has_unfinished_requests():
                wait_until(start, requests[order[nxt]].arrival_s)
                continue
            t0 = time.perf_counter()
            outputs = engine.step()
            t1 = time.perf_counter()
            t = t1 - start
            n = 0
            for out in outputs:
                i = int(out.request_id[len(prefix) :])
                tokens[i].extend(out.delta_token_ids)
                times[i].extend([t] * len(out.delta_token_ids))
                n += len(out.delta_token_ids)
            prep, num_tokens, num_prefill, num_seqs, num_sampled = self._prep
            steps.append(
                StepRecord(
                    t_end=t,
                    wall=t1 - t0,
                    schedule=engine.last_schedule_time,
                    prepare=prep,
                    model=runner.last_forward_time - prep,
                    sample=runner.last_sample_time,
                    num_tokens=num_tokens,
                    num_prefill_tokens=num_prefill,
                    num_seqs=num_seqs,
                    num_sampled=num_sampled,
                    num_running=len(sched.running),
                    num_waiting=sched.num_waiting,
                    allocated_slots=kv.num_allocated_slots(),
                    filled_slots=kv.num_filled_slots(),
                )
            )
            if on_tokens is not None and n:
                on_tokens(n)
        wall = time.perf_counter() - start
        records = [
            RequestRecord(tokens[i][: r.max_tokens], times[i][: r.max_tokens], r.arrival_s)
            for i, r in enumerate(requests)
        ]
        extra = {
            "steps": [asdict(s) for s in steps],
            "prefix_cache_hits": sched.prefix_cache_hits - hits0,
            "prefix_cache_queries": sched.prefix_cache_queries - queries0,
            "num_preemptions": sched.num_preemptions - preempt0,
        }
        return EngineRun(self.name, wall, records, extra)

    def close(self) -> None:
        self.engine = None
