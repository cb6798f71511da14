"""LLMEngine: the engine core. Requests in, one step at a time, tokens out.

    add_request ──> Scheduler (waiting -> running)          KVCacheManager (blocks, prefix cache)
                        │ each step: who runs, how many tokens  │
                        v                                      │
                    ModelRunner: flat batch -> forward (paged attention) -> logits -> sample
                        │
                        v
    step() <── tokens -> detokenize, check stops -> RequestOutput (+ events for every change)

`step()` is `schedule`, `execute_model`, `update_from_output`: one iteration of continuous
batching, a `RequestOutput` for each request that progressed. Every state change is an event.

The engine is the loop; the two ends of a request are processors of their own, as in vLLM v1:
`input_processor.py` turns a caller's prompt into checked `Request`s (a bad one: a `ValueError`
naming the bad value), and `output_processor.py` turns tokens into text, stops and outputs.
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
from nanovllm.events import Event, EventBus
from nanovllm.executor.model_runner import ModelRunnerOutput
from nanovllm.kv_transfer.base import KVConnectorRole, KVLoadError
from nanovllm.request import FinishReason, Request
from nanovllm.sampling_params import SamplingParams
from nanovllm.spec_decode.metrics import SpecDecodingStats
from nanovllm.spec_decode.propose import propose_next_tokens
from nanovllm.structured_output.manager import grammar_bitmask

logger = logging.getLogger("nanovllm")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.events = EventBus()
        # The model on every rank, its KV cache and the proposer: `setup.py`.
        self.setup = setup = set_up_engine(config, self.events)
        self.model_path, self.model_args = setup.model_path, setup.model_args
        self.max_model_len, self.device, self.dtype = setup.max_model_len, setup.device, setup.dtype
        self.attention_backend = setup.attention_backend
        self.tokenizer, self.eos_token_ids = setup.tokenizer, setup.eos_token_ids
        self.runner, self.group, self.executor = setup.runner, setup.group, setup.executor
        self.model = self.runner.model
        self.num_kv_blocks = setup.num_kv_blocks
        # Speculative decoding: the proposer (an n-gram search or a draft model), and counts of
        # what was proposed and accepted.
        self.speculative_config, self.proposer = setup.speculative_config, setup.proposer
        lookahead = setup.num_lookahead_tokens
        self.spec_stats = SpecDecodingStats()
        self.last_propose_time = 0.0  # seconds the last step spent proposing
        self._dead: BaseException | None = None  # set when a rank died: no step can run
        parts = setup.parts  # what the engine is built from (`parts.py`; a lesson's own)
        kv = self.kv_cache_manager = parts.kv_cache_manager_cls(
            self.num_kv_blocks, config.block_size, config.enable_prefix_caching, self.events,
            parts.free_block_queue,
        )  # fmt: skip
        self.kv_connector = connector = setup.connector(KVConnectorRole.SCHEDULER, self.events)
        self.scheduler = setup.scheduler_class(config, kv, self.events, lookahead, connector)
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
        self.started_event = setup.started_event(config)  # what a subscriber hears first
        self.async_step = setup.async_step(self)  # None, unless async scheduling (`async_step.py`)

    @classmethod
    def from_engine_args(cls, model: str | None = None, **kwargs) -> LLMEngine:
        return cls(EngineConfig(model=model, **kwargs))

    def shutdown(self) -> None:
        """Stop tensor parallelism's workers (also done at exit) and a KV connector's link."""
        for part in (self.group, self.kv_connector):
            if part is not None:
                part.close()

    def __del__(self) -> None:
        group = getattr(self, "group", None)
        if group is not None:
            group.close()

    # --- events -------------------------------------------------------------------------------

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Receive every event from now on (first, the `EngineStarted` description)."""
        self.events.send_to(fn, self.started_event)
        return self.events.subscribe(fn)

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
        if reset and self.kv_connector is not None:
            self.kv_connector.reset_cache()  # (the host tier too)
        return reset

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.running) + self.scheduler.num_waiting

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One iteration of continuous batching: schedule, run the model, advance the requests,
        outputs, proposals. Returns the outputs of every request that progressed or was aborted."""
        if self._dead is not None:
            raise RuntimeError(f"the engine cannot run any more: {self._dead}")
        if self.async_step is not None:  # async scheduling: the overlapped loop, `async_step.py`
            return self.async_step.step()
        sched = self.scheduler.schedule()
        result = None if sched.is_empty else self.execute_model(sched)  # (raises: aborts wait)
        outputs, self._pending = self._pending, []  # the outputs of aborts come first
        return outputs + (self.update_from_output(sched, result) if result is not None else [])

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput | None:
        """Run the step's forward pass and sample; None when a KV load failed (rolled back)."""
        sched.grammar_bitmask = grammar_bitmask(sched, self.events)  # structured outputs
        try:
            return self.executor.execute(sched)
        except KVLoadError as exc:  # before the forward pass: those requests compute instead
            self.scheduler.rollback_step(sched)
            self.kv_connector.load_failed(sched.step, exc.errors)
            return None
        except Exception as exc:
            self.scheduler.rollback_step(sched)
            if isinstance(exc, WorkerGroupError):  # a rank died (named): the group is closed
                self._dead = exc
            raise

    def update_from_output(
        self, sched: SchedulerOutput, result: ModelRunnerOutput, forward_time: float = 0.0
    ) -> list[RequestOutput]:
        """Advance the step's requests by their sampled tokens; their outputs."""
        forward_time = forward_time or self.runner.last_forward_time + self.runner.last_sample_time
        progress = [self._finish_with_error(rid, error) for rid, error in result.errors.items()]
        if self.proposer is not None:
            self.spec_stats.record_step(sched, result.sampled_token_ids, self.events)
        updated = self.scheduler.update_from_output(sched, result.sampled_token_ids)
        self.output_processor.add_prompt_logprobs(result.prompt_logprobs)
        progress += self.output_processor.process_new_tokens(
            sched.step, updated, result.logprobs, self.scheduler.finish_request
        )
        outputs = self.output_processor.make_request_outputs(progress)
        if self.proposer is not None:
            start = time.perf_counter()
            propose_next_tokens(
                self.proposer, self.scheduler.running, self.kv_cache_manager.get_block_table
            )
            self.last_propose_time = time.perf_counter() - start
        if self.events.active:
            self.events.emit(step_summary(self, sched, forward_time))
        self.last_schedule_time = sched.schedule_time
        self.last_forward_time = forward_time
        return outputs

    def _finish_with_error(self, request_id: str, error: str) -> Progress:
        """This request alone could not be sampled: finish it with the reason, not the batch."""
        request = self.scheduler.requests[request_id]
        logger.warning("nanovllm: %s", error)
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
