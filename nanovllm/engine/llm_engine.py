"""LLMEngine: the engine core. Requests in, one step at a time, tokens out.

    add_request ──> Scheduler (waiting -> running)          KVCacheManager (blocks, prefix cache)
                        │ each step: who runs, how many tokens  │
                        v                                      │
                    ModelRunner: flat batch -> forward (paged attention) -> logits -> sample
                        │
                        v
    step() <── tokens -> detokenize, check stops -> RequestOutput (+ events for every change)

`step()` runs one iteration of continuous batching in vLLM's verbs (`schedule`, `execute_model`,
`update_from_output`, `process_outputs`) and returns a `RequestOutput` for each request that made
progress.
`stream()` wraps it. Every state change is published as an event (`subscribe`). The engine is
built from finished parts by one composition root, `setup.py`, and keeps them: the scheduler
(with its KV source), the KV cache manager, the executor, the speculator, the logits mask and
the step loop (this one, or async scheduling's). `stats`: `stats.py`.

The engine is the loop; the two ends of a request are processors of their own, as in vLLM v1:
`input_processor.py` turns a caller's prompt into checked `Request`s (a bad one is rejected with
a `ValueError` naming the bad value, before it takes anything), and `output_processor.py` turns
sampled tokens into text, stops and `RequestOutput`s.

Outside `nanovllm/engine/` and `nanovllm/core/`, code reads an engine only through its public
surface (`tests/test_architecture.py` checks it): the methods add_request, abort_request, step,
stream, run_until_done, subscribe, has_unfinished_requests, get_num_unfinished_requests,
reset_prefix_cache, probe_attention, check_health, shutdown, from_engine_args, and the
attributes config, tokenizer, model_args, model_path, max_model_len, dtype, num_kv_blocks,
stats, started_event, kv_source.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator

from nanovllm.config import EngineConfig
from nanovllm.core.engine_core_outputs import EngineCoreOutputs
from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.core.step_summary import step_summary
from nanovllm.engine.input_processor import Prompt
from nanovllm.engine.output_processor import Progress
from nanovllm.engine.outputs import RequestOutput
from nanovllm.engine.setup import build_engine
from nanovllm.engine.snapshot import engine_snapshot, request_added
from nanovllm.engine.tensor_parallel import forward_times
from nanovllm.events import Event
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.kv_transfer.base import KVLoadError
from nanovllm.request import FinishReason, Request
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger("nanovllm")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # Every part, built once and finished, by the composition root (`setup.py`).
        core = build_engine(config)
        model = core.setup  # the model on its ranks
        self.tokenizer, self.model_args = model.tokenizer, model.model_args
        self.model_path, self.max_model_len = model.model_path, model.max_model_len
        self.dtype, self.num_kv_blocks = model.dtype, model.num_kv_blocks
        self.runner, self.executor, self.workers = model.runner, core.executor, core.workers
        self.events, self.stats, self.started_event = core.events, core.stats, core.started_event
        self.scheduler, self.kv_cache_manager = core.scheduler, core.kv_cache_manager
        self.input_processor, self.output_processor = core.input_processor, core.output_processor
        self.kv_source = core.kv_source  # the scheduler's (`core/kv_source.py`)
        self.speculator, self.logits_mask = core.speculator, core.logits_mask
        self.outbox: list[RequestOutput] = []  # outputs made between steps: the next step's
        self._dead: BaseException | None = None  # set when a worker died: no step can run
        # The step loop, chosen once (vLLM's `step_fn`): this engine's, or the overlapped one.
        loop = core.async_loop  # (given this engine's two halves of a step)
        overlapped = loop and functools.partial(loop.step, self.schedule, self.finish_step)
        self._step_fn = overlapped or self._step

    @classmethod
    def from_engine_args(cls, model: str | None = None, **kwargs) -> LLMEngine:
        return cls(EngineConfig(model=model, **kwargs))

    def shutdown(self) -> None:
        """Stop tensor parallelism's workers (also done at exit) and the KV source's link."""
        self.kv_source.close()
        if self.workers is not None:
            self.workers.close()

    def check_health(self) -> None:
        """Raise why the engine cannot run any more (vLLM's): a worker that died, or a step's."""
        failure = self.workers.failure if self.workers is not None else None
        if failure is not None or self._dead is not None:
            raise failure or self._dead

    def __del__(self) -> None:
        workers = getattr(self, "workers", None)
        if workers is not None:
            workers.close()

    # --- events -------------------------------------------------------------------------------

    def subscribe(self, fn: Callable[[Event], None], snapshot: bool = False) -> Callable[[], None]:
        """Receive every event from now on (first, the `EngineStarted` description; with
        `snapshot`, then the state now, for a listener that joins a running engine)."""
        self.events.send_to(fn, self.started_event)
        if snapshot:
            self.events.send_to(fn, engine_snapshot(
                self.scheduler, self.kv_cache_manager, self.stats, self.output_processor,
                self.tokenizer, self.kv_source,
            ))  # fmt: skip
        return self.events.subscribe(fn)

    def probe_attention(self, request_id: str | None, layer: int = 0) -> None:
        """From the next step on, also tell what layer `layer`'s attention computes for
        `request_id` (`AttentionProbed`: `executor/attention_probe.py`); None stops."""
        self.executor.probe_attention(request_id, layer)

    # --- requests -------------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt: Prompt, params: SamplingParams | None = None
    ) -> Request:
        """Validate and queue a request. Raises ValueError (naming the bad value) if it can't run.

        With `params.n > 1` the request is fanned out into n children (`parallel_sampling.py`);
        the first child is returned.
        """
        requests, parent = self.input_processor.process_inputs(request_id, prompt, params)
        for request in requests:
            self.output_processor.add_request(request, parent)
            self.scheduler.add_request(request)
            if self.events.active:
                self.events.emit(request_added(self.tokenizer, request))
        return requests[0]

    def abort_request(self, request_id: str) -> RequestOutput:
        """Abort a request in any state (with n > 1, every child); its blocks are freed at once."""
        requests = self.output_processor.requests_to_abort(str(request_id), self.scheduler.requests)
        for request in requests:  # (their blocks freed at once)
            self.scheduler.finish_request(request, FinishReason.ABORT)
        outputs = self.output_processor.make_request_outputs([(r, "", []) for r in requests])
        self.outbox.extend(outputs)
        return outputs[-1]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after the weights change), as vLLM's does. Refused
        (returns False, with a warning) while any block is in use: a running request's blocks
        would otherwise keep serving KV computed before the reset."""
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset:
            self.kv_source.reset_cache()  # (a host tier's too)
        return reset

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.running) + self.scheduler.num_waiting

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One iteration of continuous batching: the outputs of requests that progressed."""
        if self._dead is not None:
            raise RuntimeError(f"the engine cannot run any more: {self._dead}")
        failed = self.input_processor.take_failed()  # (requests that cannot be run after all)
        progress = [(self._end_with_error(r.request_id, e), "", []) for r, e in failed]
        self.outbox += self.output_processor.make_request_outputs(progress)
        outputs = self._step_fn()  # (raises: the outbox waits)
        ready, self.outbox = self.outbox, []  # the outputs made between steps come first
        return ready + outputs

    def _step(self) -> list[RequestOutput]:
        """The step loop: schedule, execute, update (async scheduling overlaps them instead)."""
        sched = self.schedule()
        if sched.is_empty:  # nothing to run: wait a moment for inputs still being prepared
            self.input_processor.wait_for_compiles()
            return []
        result = self.execute_model(sched)
        return [] if result is None else self.finish_step(sched, result)

    def schedule(self) -> SchedulerOutput:
        """Who runs this step, and how many tokens each; the logits rows' mask with it."""
        sched = self.scheduler.schedule()
        sched.logits_mask = self.logits_mask(sched)
        return sched

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput | None:
        """The step's forward pass and sampling on every rank. None when a KV load failed (the
        step is undone; those requests compute the tokens instead); a failed step raises."""
        try:
            return self.executor.execute(sched)
        except KVLoadError as exc:  # before the forward pass
            self.scheduler.rollback_step(sched)
            self.kv_source.load_failed(sched.step, exc.errors)
            return None
        except Exception as exc:
            self.scheduler.rollback_step(sched)
            if self.workers is not None and self.workers.closed:  # a worker died (named)
                self._dead = exc
            raise

    def finish_step(
        self, sched: SchedulerOutput, result: ModelRunnerOutput, forward_time: float = 0.0
    ) -> list[RequestOutput]:
        """The step's end: the core's update, the outputs, then the step's records.
        (`forward_time`: the step's forward pass and sampling, when the async loop timed them.)"""
        started = time.perf_counter()
        outputs = self.process_outputs(self.update_from_output(sched, result))
        seconds = self.speculator.propose(self.scheduler.running, self.kv_cache_manager)
        stats = self.stats.record_step(
            sched, self.scheduler, self.runner, seconds, started, forward_time
        )
        if self.events.active:
            times = stats.forward_time + stats.sample_time, forward_times(self.runner, self.workers)
            self.events.emit(step_summary(self.scheduler, self.kv_cache_manager, sched, *times))
        return outputs

    def update_from_output(
        self, sched: SchedulerOutput, result: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        """The engine core's half: a request whose own sampling failed ends with the reason, the
        speculator counts its verified proposals, the scheduler advances each request."""
        failed = [self._end_with_error(rid, error) for rid, error in result.errors.items()]
        self.speculator.record(sched, result.sampled_token_ids, self.events)
        updated = self.scheduler.update_from_output(sched, result.sampled_token_ids)
        return EngineCoreOutputs(
            sched.step, updated, failed, result.logprobs, result.prompt_logprobs
        )

    def process_outputs(self, core: EngineCoreOutputs) -> list[RequestOutput]:
        """The output processor's half: text, stop checks, the caller's outputs."""
        progress: list[Progress] = [(request, "", []) for request in core.failed]
        self.output_processor.add_prompt_logprobs(core.prompt_logprobs)
        progress += self.output_processor.process_new_tokens(
            core.step, core.updated, core.logprobs, self.scheduler.finish_request
        )
        return self.output_processor.make_request_outputs(progress)

    def _end_with_error(self, request_id: str, error: str) -> Request:
        """This request alone could not be run: end it with the reason, not the batch."""
        request = self.scheduler.requests[request_id]
        logger.warning("nanovllm: request %r: %s", request_id, error)
        request.error = error
        self.scheduler.finish_request(request, FinishReason.ERROR)
        return request

    # --- streaming ------------------------------------------------------------------------------

    def stream(self) -> Iterator[RequestOutput]:
        """Step until every request is done, yielding each output as soon as it is produced
        (`output.delta_text`: the new text since that request's previous output, never a
        partial stop string, never half a UTF-8 character)."""
        while self.has_unfinished_requests() or self.outbox:
            yield from self.step()

    def run_until_done(self) -> dict[str, RequestOutput]:
        """Step until every request is done: each request's finished output, by id."""
        return {output.request_id: output for output in self.stream() if output.finished}
