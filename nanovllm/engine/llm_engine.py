"""LLMEngine: the engine core. Requests in, one step at a time, tokens out.

    add_request ──> Scheduler (waiting -> running)          KVCacheManager (blocks, prefix cache)
                        │ each step: who runs, how many tokens  │
                        v                                      │
                    ModelRunner: flat batch -> forward (paged attention) -> logits -> sample
                        │
                        v
    step() <── tokens -> detokenize, check stops -> RequestOutput (+ events for every change)

`step()` runs one iteration of continuous batching in vLLM's verbs (`schedule`, `execute_model`,
`update_from_output`) and returns a `RequestOutput` for each request that made progress.
`stream()` wraps it. Every state change is published as an event (`subscribe`). Features attach
at one place each: the scheduler's KV source (a KV connector, or the `NullConnector`), the
`speculator` (or `NoSpeculation`: it proposes after each step, and the scheduler asks it for
each request's tokens to verify), the logits mask (structured outputs). `stats`: `stats.py`.

The engine is the loop; the two ends of a request are processors of their own, as in vLLM v1:
`input_processor.py` turns a caller's prompt into checked `Request`s (a bad one is rejected with
a `ValueError` naming the bad value, before it takes anything), and `output_processor.py` turns
sampled tokens into text, stops and `RequestOutput`s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from nanovllm.config import EngineConfig
from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.distributed.worker_group import WorkerGroupError
from nanovllm.engine.input_processor import InputProcessor, Prompt
from nanovllm.engine.output_processor import OutputProcessor, Progress
from nanovllm.engine.outputs import RequestOutput
from nanovllm.engine.setup import set_up_engine
from nanovllm.engine.snapshot import request_added, step_summary
from nanovllm.engine.stats import EngineStats
from nanovllm.events import Event, EventBus
from nanovllm.executor.model_runner import ModelRunnerOutput
from nanovllm.kv_transfer.base import KVLoadError
from nanovllm.kv_transfer.factory import scheduler_kv_source
from nanovllm.request import FinishReason, Request
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger("nanovllm")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.events = EventBus()
        # The model on every rank, its KV cache and the proposer: `setup.py`.
        self.setup = setup = set_up_engine(config, self.events)
        self.model_path, self.model_args = setup.model_path, setup.model_args
        self.max_model_len, self.device, self.dtype = setup.max_model_len, setup.device, setup.dtype
        self.tokenizer, self.eos_token_ids = setup.tokenizer, setup.eos_token_ids
        self.runner, self.group, self.executor = setup.runner, setup.group, setup.executor
        self.model = self.runner.model
        self.attention_backend, self.num_kv_blocks = setup.attention_backend, setup.num_kv_blocks
        self.stats = EngineStats()  # figures about the steps, filled once per step
        # The speculation part, called after each step (`spec_decode/speculator.py`).
        self.speculator = setup.speculator(self.stats.spec_decoding)
        lookahead = setup.num_lookahead_tokens
        self._dead: BaseException | None = None  # set when a worker died: no step can run
        parts = setup.parts  # what the engine is built from (`parts.py`; a lesson's own)
        kv = self.kv_cache_manager = parts.kv_cache_manager_cls(
            self.num_kv_blocks, config.block_size, config.enable_prefix_caching, self.events,
            parts.free_block_queue,
        )  # fmt: skip
        # The scheduler's KV source: a KV connector's scheduler side (its worker side runs
        # around the step), or the null one, which supplies nothing.
        self.kv_connector = kv_source = scheduler_kv_source(setup, self.events)
        self.scheduler = setup.scheduler_class(
            config, kv, self.events, lookahead, kv_source, self.speculator.tokens_to_verify
        )
        self.output_processor = OutputProcessor(self.tokenizer, self.events, parts.detokenizer)
        self.input_processor = InputProcessor(
            self.tokenizer,
            vocab_size=self.model_args.vocab_size,
            max_model_len=self.max_model_len,
            num_kv_blocks=self.num_kv_blocks,
            block_size=config.block_size,
            num_lookahead_tokens=lookahead,
            eos_token_ids=self.eos_token_ids,
            seed=config.seed,
            events=self.events,
            is_known=self._is_known,
        )
        self._pending: list[RequestOutput] = []  # outputs of aborts, returned by the next step
        # Requests whose grammar is compiling (`structured_output/manager.py`): not scheduled.
        self.awaiting_grammar: list[Request] = []
        self.started_event = setup.started_event(config)  # what a subscriber hears first
        self.async_step = setup.async_step(self)  # None, unless async scheduling (`async_step.py`)

    @classmethod
    def from_engine_args(cls, model: str | None = None, **kwargs) -> LLMEngine:
        return cls(EngineConfig(model=model, **kwargs))

    def shutdown(self) -> None:
        """Stop tensor parallelism's workers (also done at exit) and a KV connector's link."""
        self.kv_connector.close()
        if self.group is not None:
            self.group.close()

    def __del__(self) -> None:
        group = getattr(self, "group", None)
        if group is not None:
            group.close()

    # --- events -------------------------------------------------------------------------------

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Receive every event from now on (first, the `EngineStarted` description)."""
        self.events.send_to(fn, self.started_event)
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
            so = request.structured_output_request
            if so is not None and so.grammar is None:
                self.awaiting_grammar.append(request)
            if self.events.active:
                self.events.emit(request_added(self.tokenizer, request))
        return requests[0]

    def _is_known(self, request_id: str) -> bool:
        """Whether a request (or a parent of n > 1 children) with this id is in the engine."""
        return (
            request_id in self.scheduler.requests
            or request_id in self.output_processor.parent_requests
        )

    def abort_request(self, request_id: str) -> RequestOutput:
        """Abort a request in any state (with n > 1, every child); its blocks are freed at once."""
        request_id = str(request_id)
        parent = self.output_processor.parent_requests.get(request_id)
        requests = [c for c in parent.children if not c.is_finished] if parent else []
        if parent is None:
            request = self.scheduler.requests.get(request_id)
            if request is None:
                raise ValueError(f"cannot abort unknown request id {request_id!r}")
            requests = [request]
        progress = [self._finish(r, FinishReason.ABORT) for r in requests]
        outputs = self.output_processor.make_request_outputs(progress)
        self._pending.extend(outputs)
        return outputs[-1]

    def _finish(self, request: Request, reason: FinishReason) -> Progress:
        """End `request` now (an abort or an error): no more text, its blocks freed."""
        self.scheduler.finish_request(request, reason)
        return request, "", []

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after the weights change), as vLLM's does. Refused
        (returns False, with a warning) while any block is in use: a running request's blocks
        would otherwise keep serving KV computed before the reset."""
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset:
            self.kv_connector.reset_cache()  # (the host tier too)
        return reset

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.running) + self.scheduler.num_waiting

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One iteration of continuous batching: the outputs of requests that progressed."""
        if self._dead is not None:
            raise RuntimeError(f"the engine cannot run any more: {self._dead}")
        if self.awaiting_grammar:
            self._install_grammars()
        if self.async_step is not None:  # async scheduling: the overlapped loop, `async_step.py`
            return self.async_step.step()
        sched = self.scheduler.schedule()
        result = None if sched.is_empty else self.execute_model(sched)  # (raises: aborts wait)
        outputs, self._pending = self._pending, []  # the outputs of aborts come first
        if sched.is_empty and self.awaiting_grammar:  # nothing to run but compiles: wait a bit
            self.input_processor.structured_output.wait_for_any(self.awaiting_grammar)
        return outputs + (self.update_from_output(sched, result) if result is not None else [])

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput | None:
        """The step's forward pass and sampling on every rank. None when a KV load failed (the
        step is undone; those requests compute the tokens instead); a failed step raises."""
        sched.logits_mask = self.setup.logits_mask(sched, self.events)  # (structured outputs)
        try:
            return self.executor.execute(sched)
        except KVLoadError as exc:  # before the forward pass
            self.scheduler.rollback_step(sched)
            self.kv_connector.load_failed(sched.step, exc.errors)
            return None
        except Exception as exc:
            self.scheduler.rollback_step(sched)
            if isinstance(exc, WorkerGroupError):  # a worker died (named): the group is closed
                self._dead = exc
            raise

    def update_from_output(
        self, sched: SchedulerOutput, result: ModelRunnerOutput, forward_time: float = 0.0
    ) -> list[RequestOutput]:
        """Advance the requests by their tokens: outputs, statistics, the next proposals.
        (`forward_time`: the step's forward pass and sampling, when the async loop timed them.)"""
        started = time.perf_counter()
        progress = [self._finish_with_error(rid, error) for rid, error in result.errors.items()]
        self.speculator.record(sched, result.sampled_token_ids, self.events)
        updated = self.scheduler.update_from_output(sched, result.sampled_token_ids)
        self.output_processor.add_prompt_logprobs(result.prompt_logprobs)
        progress += self.output_processor.process_new_tokens(
            sched.step, updated, result.logprobs, self.scheduler.finish_request
        )
        outputs = self.output_processor.make_request_outputs(progress)
        seconds = self.speculator.propose(self.scheduler.running, self.kv_cache_manager)
        stats = self.stats.record_step(
            sched, self.scheduler, self.runner, seconds, started, forward_time
        )
        if self.events.active:
            self.events.emit(step_summary(self, sched, stats.forward_time + stats.sample_time))
        return outputs

    def _install_grammars(self) -> None:
        """Requests whose grammar has compiled are scheduled from now on; each whose compile
        failed or ran too long ends with that error (`structured_output/manager.py`)."""
        manager = self.input_processor.structured_output
        self.awaiting_grammar, failed = manager.take_compiled(self.awaiting_grammar)
        progress = [self._finish_with_error(r.request_id, error) for r, error in failed]
        self._pending.extend(self.output_processor.make_request_outputs(progress))

    def _finish_with_error(self, request_id: str, error: str) -> Progress:
        """This request alone could not be sampled: finish it with the reason, not the batch."""
        request = self.scheduler.requests[request_id]
        logger.warning("nanovllm: request %r: %s", request_id, error)
        request.error = error
        return self._finish(request, FinishReason.ERROR)

    # --- streaming ------------------------------------------------------------------------------

    def stream(self) -> Iterator[RequestOutput]:
        """Step until every request is done, yielding each output as soon as it is produced.

        `output.delta_text` is the new text since that request's previous output (never a
        partial stop string, never half a UTF-8 character).
        """
        while self.has_unfinished_requests() or self._pending:
            yield from self.step()

    def run_until_done(self) -> dict[str, RequestOutput]:
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests() or self._pending:
            for output in self.step():
                if output.finished:
                    final[output.request_id] = output
        return final
