"""The engine's statistics: one object, filled by the engine once per step.

Whoever wants figures about the engine (the benchmark's step breakdown, the server's /metrics,
the visualizer's snapshot, the stress tool) reads `LLMEngine.stats`: the last step's
`StepStats` (its parts' seconds, its shape, its queue lengths and cache counts) and running
totals since the engine started, and `live`, the figures of the moment (the queues, the KV
cache's blocks and slots), read when asked. None of them times or replaces an engine method, or reads an
engine's private field, so the engine can change inside without breaking its readers.

The names are vLLM's where it has them (`vllm/v1/metrics/stats.py`: `SchedulerStats`,
`IterationStats`, `PrefixCacheStats`); `spec_decoding` is `SpecDecodingStats`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nanovllm.core.kv_cache_usage import num_allocated_slots, num_filled_slots
from nanovllm.spec_decode.metrics import SpecDecodingStats

if TYPE_CHECKING:
    from nanovllm.core.kv_cache_manager import KVCacheManager
    from nanovllm.core.scheduler import Scheduler, SchedulerOutput
    from nanovllm.executor.model_runner import ModelRunner
    from nanovllm.request import Request


class LiveFigures:
    """The engine's figures at the moment they are read (between steps): its queues and its KV
    cache's blocks and slots."""

    def __init__(self, scheduler: Scheduler, kv_cache_manager: KVCacheManager) -> None:
        self._scheduler, self._kv = scheduler, kv_cache_manager

    @property
    def request_ids(self) -> tuple[str, ...]:
        """Every unfinished request's id (waiting or running)."""
        return tuple(self._scheduler.requests)

    @property
    def running(self) -> tuple[Request, ...]:
        """The running requests, in admission order."""
        return tuple(self._scheduler.running)

    @property
    def num_running(self) -> int:
        return len(self._scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self._scheduler.num_waiting

    @property
    def num_blocks(self) -> int:
        return self._kv.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._kv.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self._kv.num_used_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return self._kv.block_pool.num_cached_free_blocks

    @property
    def num_allocated_slots(self) -> int:
        """KV slots in used blocks."""
        return num_allocated_slots(self._kv)

    @property
    def num_filled_slots(self) -> int:
        """Of them, slots that hold a token's KV."""
        return num_filled_slots(self._kv)


@dataclass
class StepStats:
    """One step that ran: its parts' seconds, its shape, the queues and cache counts after it."""

    step: int = 0
    schedule_time: float = 0.0
    prepare_time: float = 0.0  # the step's input tensors (a part of `forward_time`)
    forward_time: float = 0.0  # inputs, forward pass and LM head (and a draft model's pass)
    sample_time: float = 0.0
    propose_time: float = 0.0  # the next step's proposals (speculative decoding)
    outputs_time: float = 0.0  # advancing the requests: tokens, text, stops, outputs, proposals
    end: float = 0.0  # when the step was done (`time.perf_counter()`; a timeline ends each step)
    num_seqs: int = 0  # requests in the step
    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0  # of them, prompt (or recomputed) tokens
    num_running: int = 0  # after the step
    num_waiting: int = 0
    num_preempted: int = 0
    # This step's admissions: prompt tokens looked up in the prefix cache, found there, and
    # supplied by a KV connector.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_hits: int = 0


@dataclass
class EngineStats:
    """Totals since the engine started, and `last`, the last step that ran."""

    num_steps: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_hits: int = 0
    schedule_time: float = 0.0
    forward_time: float = 0.0
    sample_time: float = 0.0
    propose_time: float = 0.0
    last: StepStats = field(default_factory=StepStats)
    spec_decoding: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    live: LiveFigures | None = None  # the figures of the moment
    device: str = "cpu"  # where the model runs ("cuda", "cuda:1", "cpu")
    compile_seconds: float | None = None  # torch.compile's at load (None: eager, or it failed)
    # With async scheduling, a list to record each finished step's times into (`StepTimes`,
    # `async_step.py`; the bench's timeline); None: not recorded.
    timeline: list | None = None

    def record_step(
        self,
        sched: SchedulerOutput,
        scheduler: Scheduler,
        runner: ModelRunner,
        propose: float,
        outputs_started: float,
        forward_and_sample: float = 0.0,
    ) -> StepStats:
        """Fill `last` for the step `sched` that just ran (`propose`: the seconds its proposals
        took; `outputs_started`: when the engine began advancing its requests), and add it to the
        totals. `forward_and_sample`: the two together, when the async loop timed them (its
        runner's `last_*` times may be another step's)."""
        end = time.perf_counter()
        prepare, forward = runner.last_prepare_time, runner.last_forward_time
        sample = runner.last_sample_time
        if forward_and_sample:
            prepare, forward, sample = 0.0, forward_and_sample, 0.0
        queries = scheduler.prefix_cache_queries - self.prefix_cache_queries
        hits = scheduler.prefix_cache_hits - self.prefix_cache_hits
        external = scheduler.external_prefix_cache_hits - self.external_prefix_cache_hits
        self.last = StepStats(
            step=sched.step,
            schedule_time=sched.schedule_time,
            prepare_time=prepare,
            forward_time=forward,
            sample_time=sample,
            propose_time=propose,
            outputs_time=end - outputs_started,
            end=end,
            num_seqs=len(sched.scheduled),
            num_scheduled_tokens=sched.num_scheduled_tokens,
            num_prefill_tokens=sum(s.num_new_tokens for s in sched.scheduled if s.is_prefill),
            num_running=len(scheduler.running),
            num_waiting=scheduler.num_waiting,
            num_preempted=len(sched.preempted),
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
            external_prefix_cache_hits=external,
        )
        self.num_steps += 1
        self.sync_counters(scheduler)
        self.schedule_time += sched.schedule_time
        self.forward_time += forward
        self.sample_time += sample
        self.propose_time += propose
        return self.last

    def sync_counters(self, scheduler: Scheduler) -> None:
        """The scheduler's running counts (also between steps: a rolled-back step preempts)."""
        self.num_preemptions = scheduler.num_preemptions
        self.prefix_cache_queries = scheduler.prefix_cache_queries
        self.prefix_cache_hits = scheduler.prefix_cache_hits
        self.external_prefix_cache_hits = scheduler.external_prefix_cache_hits
