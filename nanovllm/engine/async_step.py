"""The overlapped step loop: vLLM's async scheduling (`async_scheduling=True`).

`LLMEngine.step()` does its own work in series with the forward pass: schedule, build the inputs,
run the model, then detokenize, check stops and make outputs. Here the forward pass runs in a
worker thread (torch releases the GIL inside its ops), and the engine does the rest meanwhile:

    main thread:  sched 2 | prep 2 | outputs 1 | sched 3 | prep 3 | outputs 2 | sched 4 ...
    worker:       [ forward + sample 1 ]  [ forward + sample 2 ]  [ forward + sample 3 ]
                                       ^ step 2's input ids get step 1's tokens here

Step N+1 is scheduled (by the `AsyncScheduler`) and its inputs built while step N runs, assuming
every request that samples in step N gets one token, not known yet: its input row holds a
placeholder, filled with step N's sampled token in the worker, just before step N+1's forward
pass (vLLM's `prev_sampled_token_ids`). Step N's outputs are made while step N+1 runs. Each call
of `step()` schedules one step and finishes the one before it: two steps are in flight at most,
as in vLLM's `step_with_batch_queue` with a queue of two.

A request that stops at step N was already scheduled in step N+1: that work is dropped without a
trace. Its token from step N+1 is skipped (`AsyncScheduler.update_from_output`); its blocks were
freed when it stopped (they are handed out again only to steps that run after step N+1); and its
events from scheduling step N+1 are not told (`merge_step_events`). The events come out in the
order the plain loop tells them: step N's scheduling, its executor events, its outputs, then
step N+1's scheduling.

Sampling step N+1 waits until step N's outputs are made (penalties read the output tokens so
far). A grammar (structured outputs) needs the token before it to mask the next: while a running
request has one, the loop does not schedule ahead. The step summary event of step N, made with
its outputs, counts the KV slots step N+1 was already given (`num_filled_slots`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from nanovllm.core.async_scheduler import AsyncScheduler
from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.engine.outputs import RequestOutput
from nanovllm.engine.stats import EngineStats
from nanovllm.events import (
    BlockAllocated,
    BlockCached,
    BlockFreed,
    Event,
    EventBus,
    RequestFinished,
    RequestScheduled,
)
from nanovllm.executor.expert_load_events import ExpertLoadReader
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.executor.prompt_logprobs import with_prompt_rows
from nanovllm.executor.step_events import executor_events
from nanovllm.executor.step_inputs import step_inputs

# The engine's two halves of a step (`llm_engine.py`), which the loop calls in its own order.
Schedule = Callable[[], SchedulerOutput]  # `LLMEngine.schedule`: the step and its logits mask
# `LLMEngine.finish_step(sched, result, forward_time)`: the step's outputs
Finish = Callable[[SchedulerOutput, ModelRunnerOutput, float], list[RequestOutput]]


@dataclass
class StepTimes:
    """When one step's parts ran (`time.perf_counter()` seconds), for the bench's timeline."""

    step: int
    schedule: tuple[float, float] = (0.0, 0.0)  # scheduling and building the inputs (main)
    # Filling the placeholders, forward pass and sampling (worker; sampling first waits, if
    # need be, until the step before has made its outputs).
    forward: tuple[float, float] = (0.0, 0.0)
    outputs: tuple[float, float] = (0.0, 0.0)  # update, detokenize, stops, outputs (main)


@dataclass
class InFlight:
    """A step handed to the worker: what it runs, its result to come, what it told on the way."""

    sched: SchedulerOutput
    inputs: tuple
    result: Future
    may_sample: threading.Event  # set when the step before has made its outputs
    times: StepTimes
    held_events: list[Event] = field(default_factory=list)
    # A mixture of experts' `expert_load`s right after this step's forward pass (the next
    # step's may have run by the time its events are told).
    expert_loads: dict[int, torch.Tensor] = field(default_factory=dict)


class AsyncStep:
    """The overlapped loop over one engine's scheduler and rank 0's runner (see the module
    docstring). While `stats.timeline` is a list, each finished step's `StepTimes` is appended."""

    def __init__(
        self,
        scheduler: AsyncScheduler,
        runner: ModelRunner,
        events: EventBus,
        attention_backend: str,
        stats: EngineStats,
    ) -> None:
        self.scheduler, self.runner, self.events = scheduler, runner, events
        self.attention_backend = attention_backend
        self.stats = stats
        self.expert_loads = ExpertLoadReader(runner.model)  # (a dense model's reads nothing)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanovllm-forward")
        self.in_flight: deque[InFlight] = deque()
        # Events of a schedule that ran nothing, told after the outputs of the step before it.
        self.held_after_oldest: list[Event] = []

    def step(self, schedule: Schedule, finish: Finish) -> list[RequestOutput]:
        """Schedule the next step (it starts as soon as the worker is free), then make the
        outputs of the oldest step in flight, unless the new one is the only one."""
        submitted = False
        if self.scheduler.has_unfinished_requests() and self._may_schedule_ahead():
            start = time.perf_counter()
            with self.events.holding() as held:  # (with the logits mask's events)
                sched = schedule()
            if sched.is_empty:  # (its events, if any, are told after the outputs before it)
                self.held_after_oldest += held
            else:
                self._submit(sched, held, start)
                submitted = True
        outputs = []
        if self.in_flight and not (submitted and len(self.in_flight) == 1):
            outputs += self._finish_oldest(finish)
        elif not self.in_flight:
            self.events.deliver(self.held_after_oldest)
            self.held_after_oldest = []
        while self.in_flight and not self.scheduler.has_unfinished_requests():
            outputs += self._finish_oldest(finish)  # a step for requests that all stopped: drop it
        return outputs

    def _may_schedule_ahead(self) -> bool:
        """One step ahead at most; none while a running request's grammar needs its last token."""
        if not self.in_flight:
            return True
        if len(self.in_flight) == 2:
            return False
        return not any(r.structured_output_request for r in self.scheduler.running)

    # --- the main thread: schedule and prepare, then make the step before's outputs ---------

    def _submit(self, sched: SchedulerOutput, held: list[Event], start: float) -> None:
        inputs, fill = self._prepare(sched)
        previous = self.in_flight[-1] if self.in_flight else None
        times = StepTimes(sched.step)
        times.schedule = (start, time.perf_counter())
        may_sample = threading.Event()
        if previous is None:
            may_sample.set()
        step = InFlight(sched, inputs, Future(), may_sample, times, held)
        step.result = self.worker.submit(self._run, step, fill, previous)
        self.in_flight.append(step)
        if previous is None:
            self.events.deliver(held)  # nothing before it to tell first
            step.held_events = []

    def _prepare(self, sched: SchedulerOutput) -> tuple[tuple, list[tuple[int, str]]]:
        """Step N+1's inputs, built while step N runs. A request whose last token step N is
        still sampling gets a placeholder there (0): the rows to fill, with whose token."""
        runner = self.runner
        waiting_for = [
            s
            for s in sched.scheduled
            if s.num_computed_tokens + s.num_new_tokens > s.request.num_tokens
        ]
        for s in waiting_for:
            s.request.all_token_ids.append(0)  # (only while the inputs are built)
        try:
            inputs = with_prompt_rows(runner.prepare_inputs(sched), sched)
        finally:
            for s in waiting_for:
                s.request.all_token_ids.pop()
        starts = inputs[2].query_start_list  # request i's rows start at starts[i]
        index = {id(s): i for i, s in enumerate(sched.scheduled)}
        fill = [(starts[index[id(s)] + 1] - 1, s.request.request_id) for s in waiting_for]
        return inputs, fill

    def _finish_oldest(self, finish: Finish) -> list[RequestOutput]:
        """Wait for the oldest step in flight; make its outputs (while the next one runs)."""
        events, scheduler, step = self.events, self.scheduler, self.in_flight[0]
        try:
            result, forward_time = step.result.result()
        except BaseException:
            self._roll_back_all()
            raise
        self.in_flight.popleft()
        start = time.perf_counter()
        sched = without_stopped(step.sched)
        outputs: list[RequestOutput] = []
        with events.holding() as told:
            if events.active and sched.scheduled:
                inputs = step.inputs
                if sched is not step.sched:  # (the rows of the kept requests, rebuilt)
                    inputs = with_prompt_rows(step_inputs(sched, self.runner.block_size), sched)
                for event in self._executor_events(sched, inputs, result):
                    events.emit(event)
                loads = self.expert_loads.event(sched.step, step.expert_loads)
                if loads is not None:
                    events.emit(loads)
            step_count, scheduler.step_count = scheduler.step_count, sched.step
            try:
                if sched.scheduled:
                    outputs = finish(sched, result, forward_time)
            finally:
                scheduler.step_count = step_count
                if self.in_flight:  # the next step's sampling sees these tokens (penalties)
                    self.in_flight[0].may_sample.set()
        with events.holding() as cached:  # blocks its new tokens filled enter the prefix cache
            for s in sched.scheduled:
                scheduler.cache_blocks(s.request)
        if self.in_flight:
            later, self.in_flight[0].held_events = self.in_flight[0].held_events, []
        else:
            later, self.held_after_oldest = self.held_after_oldest, []
        events.deliver(merge_step_events(told, later, cached))
        step.times.outputs = (start, time.perf_counter())
        if self.stats.timeline is not None:
            self.stats.timeline.append(step.times)
        return outputs

    def _roll_back_all(self) -> None:
        """A step failed: wait for the one after it, and undo both (newest first)."""
        for step in list(self.in_flight)[1:]:
            step.may_sample.set()
            try:
                step.result.result()
            except BaseException:  # noqa: BLE001 - the first step's error is the one raised
                pass
        for step in reversed(self.in_flight):
            self.scheduler.rollback_step(step.sched)
        self.in_flight.clear()

    # --- the worker thread: fill in the placeholders, forward pass, sample -------------------

    def _run(
        self, step: InFlight, fill: list[tuple[int, str]], previous: InFlight | None
    ) -> tuple[ModelRunnerOutput, float]:
        runner = self.runner
        start = time.perf_counter()
        if fill:
            before = previous.result.result()[0].sampled_token_ids  # (done: this thread ran it)
            rows = torch.tensor([row for row, _ in fill], dtype=torch.int64)
            step.inputs[0][rows] = torch.tensor(
                [before.get(rid, [0])[-1] for _, rid in fill], dtype=step.inputs[0].dtype
            )
        logits = runner.forward_logits(*step.inputs)
        step.expert_loads = self.expert_loads.read()  # (tensors the next forward replaces)
        step.may_sample.wait()
        result = runner.sample(step.sched, logits)
        end = time.perf_counter()
        step.times.forward = (start, end)
        return result, end - start

    def _executor_events(self, sched, inputs, result) -> list[Event]:
        args = self.runner.model.args
        return executor_events(
            sched, inputs, result, self.runner.block_size, args.num_hidden_layers,
            args.vocab_size, self.attention_backend,
        )  # fmt: skip


def without_stopped(sched: SchedulerOutput) -> SchedulerOutput:
    """The step as the plain loop would have run it: without the requests that stopped (or were
    aborted) after it was scheduled."""
    kept = [s for s in sched.scheduled if not s.request.is_finished]
    return (
        sched if len(kept) == len(sched.scheduled) else dataclasses.replace(sched, scheduled=kept)
    )


def merge_step_events(told: list[Event], held: list[Event], cached: list[Event]) -> list[Event]:
    """Step N's output events, then step N+1's scheduling events, as the plain loop tells them.

    `cached`: blocks that step N's tokens filled, cached after its outputs; the plain loop
    caches them when it schedules step N+1, just before the request's `RequestScheduled`.

    A request that finished in step N's outputs was never in step N+1 for the plain loop: its
    events from scheduling step N+1 are dropped, with the block it was given there (its
    `BlockAllocated`, and the `BlockFreed` of that block when it finished). What else happened
    to it there that lasts (a block it filled was cached; a preemption freed its blocks) is told
    just before it finished, where the plain loop tells it.
    """
    for e in reversed(cached):
        at = [i for i, h in enumerate(held) if isinstance(h, RequestScheduled)]
        at = [i for i in at if held[i].request_id == e.request_id] or [len(held)]
        held.insert(at[0], e)
    finished = {e.request_id for e in told if isinstance(e, RequestFinished)}
    if not finished:
        return told + held
    given = {
        (e.request_id, e.block_id)
        for e in held
        if isinstance(e, BlockAllocated) and e.request_id in finished
    }
    carried: dict[str, list[Event]] = defaultdict(list)
    later = []
    for e in held:
        rid = getattr(e, "request_id", None)
        if rid not in finished:
            later.append(e)
        elif isinstance(e, BlockCached | BlockFreed) and (rid, e.block_id) not in given:
            carried[rid].append(e)
    merged = []
    for e in told:
        if isinstance(e, BlockFreed) and (e.request_id, e.block_id) in given:
            continue
        if isinstance(e, RequestFinished):
            merged.extend(carried.pop(e.request_id, []))
        merged.append(e)
    return merged + later
