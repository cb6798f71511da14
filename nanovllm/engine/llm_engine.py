"""LLMEngine: the engine core. Requests in, one step at a time, tokens out.

    add_request ──> Scheduler (waiting -> running)          KVCacheManager (blocks, prefix cache)
                        │ each step: who runs, how many tokens  │
                        v                                      │
                    ModelRunner: flat batch -> forward (paged attention) -> logits -> sample
                        │
                        v
    step() <── tokens -> detokenize, check stops -> RequestOutput (+ events for every change)

`step()` runs exactly one iteration of continuous batching and returns a `RequestOutput` for
each request that made progress (got a token, or finished). `stream()` wraps it for callers that
want text as it appears. Every state change is published as an event (`subscribe`).

Input checking lives here, at the door: a bad request is rejected with a `ValueError` naming the
bad value (and a `RequestRejected` event) before it takes anything, so it never disturbs the
requests already running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanovllm.config import EngineConfig
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.scheduler import Scheduler, SchedulerOutput
from nanovllm.distributed.worker_group import WorkerGroupError
from nanovllm.engine.detokenizer import (
    DetokenizerState,
    IncrementalDetokenizer,
    find_stop_string,
    take_streamable,
)
from nanovllm.engine.eos import eos_token_ids
from nanovllm.engine.outputs import CompletionOutput, Logprob, RequestOutput
from nanovllm.engine.parallel_sampling import (
    ParentRequest,
    child_params,
    child_request_id,
)
from nanovllm.engine.snapshot import token_texts
from nanovllm.events import (
    EngineStarted,
    Event,
    EventBus,
    RequestAdded,
    RequestRejected,
    SpecTokensVerified,
    StepSummary,
    TokenEmitted,
)
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.tensor_parallel import RunnerSpec, start_runners
from nanovllm.models.loader import load_model_args, load_tokenizer, resolve_dtype
from nanovllm.request import FinishReason, Request
from nanovllm.sampling_params import RequestOutputKind, SamplingParams
from nanovllm.spec_decode.config import SpeculativeConfig
from nanovllm.spec_decode.draft_model_proposer import DraftModelProposer
from nanovllm.spec_decode.ngram_proposer import NgramProposer

logger = logging.getLogger("nanovllm")

Prompt = str | list[int] | dict


def default_model_path() -> Path:
    import nanovllm.default_model

    return Path(nanovllm.default_model.__file__).parent


def pick_attention_backend(
    requested: str | None, device: torch.device, dtype: torch.dtype = torch.float32
) -> str:
    """The fastest backend where we run: Triton's kernels on a GPU; on a CPU the in-place numba
    kernel for float32 (when numba is installed; otherwise it says so once), else plain torch.

    (On a CPU Triton can only run through its interpreter, thousands of times slower.)
    """
    if requested is not None:
        if requested == "cpu" and device.type != "cpu":
            raise ValueError(f"attention_backend='cpu' runs on a CPU, not on {device}")
        return requested
    if device.type == "cuda":
        from nanovllm.kernels.triton_setup import triton_available

        if triton_available():
            return "triton"
        return "torch"
    from nanovllm.kernels.cpu_paged_attention import cpu_fast_path_available

    return "cpu" if cpu_fast_path_available(dtype) else "torch"


@dataclass
class SpecDecodingStats:
    """Speculative decoding so far, vLLM's counters: how many times requests verified proposals
    (`num_drafts`), how many tokens were proposed, how many of those were accepted, and per
    position i (from 0) how many drafts had their proposal i accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def record(self, num_proposed: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        per_pos = self.num_accepted_tokens_per_pos
        per_pos.extend([0] * (num_accepted - len(per_pos)))
        for position in range(num_accepted):  # the first num_accepted were accepted
            per_pos[position] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verifying step: the accepted proposals plus the one the step adds."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.events = EventBus()
        path = Path(config.model) if config.model else default_model_path()
        self.model_path = path
        hf_config, args = load_model_args(path)
        self.model_args = args

        if config.max_model_len is None:
            self.max_model_len = args.max_position_embeddings
        elif config.max_model_len > args.max_position_embeddings:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's limit "
                f"(max_position_embeddings={args.max_position_embeddings})"
            )
        else:
            self.max_model_len = config.max_model_len
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={config.max_num_batched_tokens} is smaller than "
                f"max_model_len={self.max_model_len}; without chunked prefill a whole prompt must "
                "fit in one step"
            )

        self.device = torch.device(
            config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.dtype = resolve_dtype(config.dtype, hf_config, self.device)
        dtype = str(self.dtype).removeprefix("torch.")
        if config.num_threads and self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.attention_backend = pick_attention_backend(
            config.attention_backend, self.device, self.dtype
        )
        if self.attention_backend == "triton":
            from nanovllm.kernels.paged_attention import check_supported

            check_supported(config.block_size, args.head_dim)

        self.tokenizer = load_tokenizer(path)
        self.eos_token_ids = eos_token_ids(path, hf_config, self.tokenizer)
        # The model (rank 0's shard of it with tensor parallelism, the other ranks starting in
        # their own processes) and its runner.
        tp = config.tensor_parallel_size
        threads = config.num_threads
        if tp > 1 and not threads and self.device.type == "cpu":
            threads = max(torch.get_num_threads() // tp, 1)  # ranks share the machine's cores
        spec = RunnerSpec(
            path, self.dtype, self.device.type, self.attention_backend, self.max_model_len,
            config.block_size, threads, config.enforce_eager,
        )  # fmt: skip
        # Speculative decoding: the proposer (an n-gram search or a draft model), and counts of
        # what was proposed and accepted.
        self.speculative_config = None
        self.proposer: NgramProposer | DraftModelProposer | None = None
        lookahead = 0
        if config.speculative_config is not None:
            self.speculative_config = SpeculativeConfig.from_dict(config.speculative_config)
            self.proposer = self._load_proposer(self.speculative_config, spec)
            lookahead = self.speculative_config.num_lookahead_tokens
        self.spec_stats = SpecDecodingStats()
        self.last_propose_time = 0.0  # seconds the last step spent proposing
        self.runner, self.group = start_runners(tp, spec, args)
        self.model = self.runner.model
        self._dead: BaseException | None = None  # set when a rank died: no step can run
        self.graphs_wanted = self._graphs_wanted()
        self.num_kv_blocks = self._num_kv_blocks(lookahead)
        self._on_every_rank("allocate_kv_cache", self.num_kv_blocks)
        self._capture_decode_graphs(lookahead)
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.runner.allocate_kv_cache(self.num_kv_blocks)  # the same block ids
            self.runner.draft = self.proposer.runner
        self.kv_cache_manager = KVCacheManager(
            self.num_kv_blocks, config.block_size, config.enable_prefix_caching, self.events
        )
        self.scheduler = Scheduler(config, self.kv_cache_manager, self.events, lookahead)
        self.detokenizer = IncrementalDetokenizer(self.tokenizer)
        self._detok: dict[str, DetokenizerState] = {}
        self._pending: list[RequestOutput] = []  # outputs of aborts, returned by the next step
        self._parents: dict[str, ParentRequest] = {}  # requests with n > 1, by the caller's id
        self._arrivals = 0
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self.started_event = EngineStarted(
            model=path.name,
            num_kv_blocks=self.num_kv_blocks,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=config.enable_chunked_prefill,
            attention_backend=self.attention_backend,
            tensor_parallel_size=config.tensor_parallel_size,
            speculative_method=self.speculative_config and self.speculative_config.method,
            num_speculative_tokens=(
                self.speculative_config.num_speculative_tokens if self.speculative_config else 0
            ),
        )
        capacity = self.num_kv_blocks * config.block_size
        logger.info(
            "nanovllm: %s on %s (%s), attention backend %r; KV cache size: %d tokens "
            "(%d blocks x %d); maximum concurrency for %d tokens per request: %.2fx",
            path.name, self.device, dtype, self.attention_backend, capacity,
            self.num_kv_blocks, config.block_size, self.max_model_len,
            capacity / self.max_model_len,
        )  # fmt: skip

    @classmethod
    def from_engine_args(cls, model: str | None = None, **kwargs) -> LLMEngine:
        return cls(EngineConfig(model=model, **kwargs))

    # --- setup helpers --------------------------------------------------------------------------

    def _load_proposer(
        self, spec: SpeculativeConfig, target: RunnerSpec
    ) -> NgramProposer | DraftModelProposer:
        k = spec.num_speculative_tokens
        if spec.method == "ngram":
            return NgramProposer(k, spec.prompt_lookup_min, spec.prompt_lookup_max)
        assert spec.model is not None
        return DraftModelProposer.load(spec.model, k, target, self.model_args, self.tokenizer)

    def _graphs_wanted(self) -> bool:
        """Whether decode steps are to be captured as CUDA graphs: with `enforce_eager=False`
        on a GPU, where they can serve (otherwise this says why not, once)."""
        if self.config.enforce_eager or self.device.type != "cuda":
            return False
        why_not = None
        if self.attention_backend != "triton":
            why_not = f"attention backend {self.attention_backend!r} (only 'triton' is captured)"
        elif self.group is not None:
            why_not = "tensor parallelism"
        if why_not is not None:
            logger.warning("nanovllm: no CUDA graphs with %s; decode steps run eagerly", why_not)
            return False
        return True

    def _capture_decode_graphs(self, lookahead: int) -> None:
        """Replay decode steps from CUDA graphs (executor/cuda_graphs.py) if `_graphs_wanted`
        said so; if capturing fails, say why, and run them eagerly."""
        config = self.config
        if not self.graphs_wanted:
            return
        max_blocks = -(-(self.max_model_len + lookahead) // config.block_size)
        try:
            seconds = self.runner.capture_decode_graphs(config.max_num_seqs, max_blocks)
        except Exception as exc:  # the model then runs as it would without graphs
            self.runner.graphs = None
            logger.warning(
                "nanovllm: capturing CUDA graphs failed (%s: %s); decode steps run eagerly",
                type(exc).__name__, exc,
            )  # fmt: skip
            return
        logger.info(
            "nanovllm: captured CUDA graphs for decode batches of %s requests in %.1f s",
            ", ".join(map(str, self.runner.graphs.batch_sizes)), seconds,
        )  # fmt: skip

    def _num_kv_blocks(self, lookahead: int) -> int:
        """How many KV blocks, each with its slots in every layer (and, with a draft model, in
        every layer of the draft too: its cache has the same blocks)."""
        config = self.config
        if config.num_kv_blocks is not None:
            return config.num_kv_blocks
        per_block = ModelRunner.kv_bytes_per_block(
            self.model_args, config.block_size, self.dtype, config.tensor_parallel_size
        )
        if isinstance(self.proposer, DraftModelProposer):
            per_block += ModelRunner.kv_bytes_per_block(
                self.proposer.runner.model.args, config.block_size, self.dtype
            )
        budget = config.kv_cache_memory_bytes
        if budget is None:  # the smallest any rank can give (each holds its heads' share)
            budgets = self._on_every_rank(
                "measure_kv_budget", config, self.max_model_len, self.graphs_wanted, all=True
            )
            budget = min(budgets)
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(
                f"kv_cache_memory_bytes={budget} is too small for a single KV block "
                f"({per_block} bytes at block_size={config.block_size})"
            )
        # More than every sequence at full length could ever use is wasted memory.
        useful = config.max_num_seqs * -(-(self.max_model_len + lookahead) // config.block_size)
        return int(min(num_blocks, useful))

    def _on_every_rank(self, method: str, *args, all: bool = False):
        """Call a runner method on every rank (just here without tensor parallelism): rank 0's
        result, or with `all` every rank's in rank order."""
        if self.group is None:
            result = getattr(self.runner, method)(*args)
            return [result] if all else result
        return self.group.run_all(method, *args) if all else self.group.run(method, *args)

    def shutdown(self) -> None:
        """Stop the worker processes of tensor parallelism (also done at interpreter exit)."""
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

    # --- requests -------------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt: Prompt, params: SamplingParams | None = None
    ) -> Request:
        """Validate and queue a request. Raises ValueError (naming the bad value) if it can't run.

        With `params.n > 1` the request is fanned out into n children (`parallel_sampling.py`);
        the first child is returned.
        """
        request_id = str(request_id)
        params = params or SamplingParams()
        try:
            if request_id in self._parents:
                raise ValueError(f"request id {request_id!r} is already in the engine")
            text, token_ids = self._tokenize(prompt)
            if not isinstance(params, SamplingParams) or params.n == 1:
                request = self._make_request(request_id, text, token_ids, params)
                self._queue(request)
                return request
            children = [
                self._make_request(
                    child_request_id(request_id, i), text, token_ids, child_params(params, i)
                )
                for i in range(params.n)
            ]
        except ValueError as exc:
            if self.events.active:
                self.events.emit(RequestRejected(request_id, str(exc)))
            raise
        parent = ParentRequest(request_id, text, children[0].prompt_token_ids, children)
        self._parents[request_id] = parent
        for i, child in enumerate(children):
            child.parent_id, child.index = request_id, i
            self._queue(child)
        return children[0]

    def _queue(self, request: Request) -> None:
        self.scheduler.add_request(request)
        if request.sampling_params.detokenize:  # (without it, outputs carry no text)
            self._detok[request.request_id] = DetokenizerState.after_prompt(
                request.prompt_token_ids, request.sampling_params.skip_special_tokens
            )
        if self.events.active:
            self.events.emit(
                RequestAdded(
                    request.request_id,
                    request.prompt,
                    request.num_prompt_tokens,
                    request.max_tokens,
                    token_texts(self.tokenizer, request.prompt_token_ids),
                )
            )

    def _make_request(
        self, request_id: str, text: str | None, token_ids: list[int], params: SamplingParams
    ) -> Request:
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"sampling params must be a SamplingParams, got {type(params).__name__}"
            )
        if request_id in self.scheduler.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if not token_ids:
            raise ValueError(
                f"prompt {text if text is not None else token_ids!r} is empty: it has no tokens"
            )
        vocab = self.model_args.vocab_size
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})")
        if params.logprobs is not None and params.logprobs > vocab:
            raise ValueError(f"logprobs={params.logprobs} exceeds the vocabulary size {vocab}")
        n = len(token_ids)
        if n >= self.max_model_len:
            raise ValueError(
                f"prompt of {n} tokens does not fit max_model_len={self.max_model_len} "
                "(at least one token must be generated)"
            )
        max_tokens = min(params.max_tokens or self.max_model_len, self.max_model_len - n)
        capacity = self.num_kv_blocks * self.config.block_size
        lookahead = self.scheduler.num_lookahead_tokens
        if n + max_tokens - 1 + lookahead > capacity:
            extra = f" + {lookahead} lookahead slots for the draft model" if lookahead else ""
            raise ValueError(
                f"prompt of {n} tokens plus max_tokens={max_tokens} needs {n + max_tokens - 1} KV "
                f"slots{extra}, more than the whole KV cache ({capacity} = {self.num_kv_blocks} "
                f"blocks x {self.config.block_size})"
            )
        seed = params.seed
        if seed is None and not params.greedy:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        self._arrivals += 1
        return Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_index=self._arrivals,
            prompt=text,
            max_tokens=max_tokens,
            eos_token_ids=self.eos_token_ids,
            seed=seed,
        )

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self._tokenize(prompt["prompt"])
            raise ValueError(
                f"prompt dict needs 'prompt' or 'prompt_token_ids', got keys {list(prompt)}"
            )
        if isinstance(prompt, list | tuple):
            return None, list(prompt)
        raise ValueError(
            f"prompt must be a string, a token id list or a dict, got {type(prompt).__name__}"
        )

    def abort_request(self, request_id: str) -> RequestOutput:
        """Abort a request in any state (with n > 1, every child); its blocks are freed at once."""
        request_id = str(request_id)
        parent = self._parents.get(request_id)
        requests = [c for c in parent.children if not c.is_finished] if parent else []
        if parent is None:
            request = self.scheduler.requests.get(request_id)
            if request is None:
                raise ValueError(f"cannot abort unknown request id {request_id!r}")
            requests = [request]
        outputs = self._outputs([self._finish(r, FinishReason.ABORT) for r in requests])
        self._pending.extend(outputs)
        return outputs[-1]

    def _finish(self, request: Request, reason: FinishReason) -> tuple[Request, str, list[int]]:
        """End `request` now (an abort or an error): no more text, its blocks freed."""
        self.scheduler.finish_request(request, reason)
        return request, "", []

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after the weights change), as vLLM's does.

        Refused (returns False, with a warning) while any block is in use: a running request's
        blocks would otherwise keep serving KV computed before the reset.
        """
        return self.kv_cache_manager.reset_prefix_cache()

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.running) + self.scheduler.num_waiting

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self._dead is not None:
            raise RuntimeError(f"the engine cannot run any more: {self._dead}")
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return outputs
        try:
            result = self.runner.execute(sched)
        except Exception as exc:
            self.scheduler.rollback_step(sched)
            self._pending = outputs + self._pending  # the aborts' outputs wait for the next step
            if isinstance(exc, WorkerGroupError):  # a rank died (named): the group is closed
                self._dead = exc
            raise
        forward_time = self.runner.last_forward_time + self.runner.last_sample_time
        emit = self.events.active
        logprobs = result.logprobs
        progress: list[tuple[Request, str, list[int]]] = []  # (request, new text, new tokens)
        for request_id, error in result.errors.items():
            # This request alone could not be sampled: finish it with the reason, not the batch.
            request = self.scheduler.requests[request_id]
            logger.warning("nanovllm: %s", error)
            request.error = error
            progress.append(self._finish(request, FinishReason.ERROR))
        if self.proposer is not None:
            self._count_verified(sched, result.sampled_token_ids)
        for request, num_new in self.scheduler.update_from_output(sched, result.sampled_token_ids):
            # One token, or with speculative decoding several: each is checked for a stop in
            # turn, and tokens after the one that stops the request are dropped.
            first = request.num_output_tokens - num_new
            new_tokens = request.output_token_ids[first:]
            entries = logprobs.get(request.request_id)
            text, finished = "", None
            for j, token in enumerate(new_tokens):
                num_output = first + j + 1
                if entries is not None:
                    request.logprobs.append(entries[j])
                token_ids = request.all_token_ids
                if j < num_new - 1:  # the detokenizer must not see the tokens after this one
                    token_ids = token_ids[: request.num_prompt_tokens + num_output]
                delta, finished = self._process_token(request, token, token_ids, num_output)
                text += delta
                if emit:
                    self.events.emit(
                        TokenEmitted(sched.step, request.request_id, token, delta, num_output)
                    )
                if finished is not None:
                    request.drop_output_tokens_after(num_output)
                    break
            if finished is not None:
                self.scheduler.finish_request(request, finished)
            progress.append((request, text, request.output_token_ids[first:]))
        outputs.extend(self._outputs(progress))
        if self.proposer is not None:
            start = time.perf_counter()
            self._propose()
            self.last_propose_time = time.perf_counter() - start
        if emit:
            self.events.emit(self._summary(sched, forward_time))
        self.last_schedule_time = sched.schedule_time
        self.last_forward_time = forward_time
        return outputs

    def _count_verified(self, sched: SchedulerOutput, sampled: dict[str, list[int]]) -> None:
        """Statistics (and events) of the proposals this step verified."""
        emit = self.events.active
        for s in sched.scheduled:
            tokens = sampled.get(s.request.request_id)
            if not s.spec_token_ids or tokens is None:
                continue
            num_accepted = len(tokens) - 1
            self.spec_stats.record(len(s.spec_token_ids), num_accepted)
            if emit:
                self.events.emit(
                    SpecTokensVerified(
                        sched.step, s.request.request_id, tuple(s.spec_token_ids), num_accepted
                    )
                )

    def _propose(self) -> None:
        """Proposals for every decoding request's next step (speculative decoding)."""
        # Not those still prefilling: nothing to speculate on yet.
        decoding = [r for r in self.scheduler.running if r.num_computed_tokens == r.num_tokens - 1]
        # No point proposing past max_tokens: the step emits up to k + 1 tokens.
        rooms = [r.max_tokens - r.num_output_tokens - 1 for r in decoding]
        if isinstance(self.proposer, DraftModelProposer):
            tables = [self.kv_cache_manager.get_block_table(r.request_id) for r in decoding]
            proposals = self.proposer.propose(decoding, tables, rooms)
        else:
            assert self.proposer is not None
            proposals = [self.proposer.propose(r.all_token_ids, n) for r, n in zip(decoding, rooms)]
        for request, proposal in zip(decoding, proposals):
            request.spec_token_ids = proposal

    def _process_token(
        self, request: Request, token: int, token_ids: list[int], num_output: int
    ) -> tuple[str, FinishReason | None]:
        """Detokenize a new token (`token_ids` ends with it, the `num_output`-th output token)
        and decide whether the request is done."""
        params = request.sampling_params
        state = self._detok.get(request.request_id)  # None: detokenize=False
        stop = None
        if state is not None:
            self.detokenizer.step(state, token_ids)
            stop = find_stop_string(state, params.stop_strings, params.include_stop_str_in_output)
        finished: FinishReason | None = None
        if stop is not None:
            finished, request.stop_reason = FinishReason.STOP, stop
        elif not params.ignore_eos and token in request.eos_token_ids:
            finished = FinishReason.STOP
        elif token in params.stop_token_ids:
            finished, request.stop_reason = FinishReason.STOP, token
        elif num_output >= request.max_tokens:
            finished = FinishReason.LENGTH
        if finished is not None:
            request.finish_reason = finished
            if stop is None and state is not None:  # (a stop-string cut decided the final text)
                self.detokenizer.step(state, token_ids, final=True)
        if state is None:
            return "", finished
        delta = take_streamable(state, params.stop_strings, finished is not None)
        return delta, finished

    def _outputs(self, progress: list[tuple[Request, str, list[int]]]) -> list[RequestOutput]:
        """The caller's view of this step's progress: one output per request, or per parent of
        children (n > 1), in the order they progressed; with `FINAL_ONLY`, only those that
        finished. Forgets what finished."""
        outputs: list[RequestOutput] = []
        parents: dict[str, ParentRequest] = {}
        for request, delta, delta_ids in progress:
            if (
                request.sampling_params.output_kind == RequestOutputKind.FINAL_ONLY
                and not request.is_finished
            ):
                continue  # (nobody reads it: skip building it, a real cost at every step)
            completion = self._completion(request, delta, delta_ids)
            if request.parent_id is None:
                outputs.append(
                    RequestOutput(
                        request_id=request.request_id,
                        prompt=request.prompt,
                        prompt_token_ids=request.prompt_token_ids,
                        outputs=[completion],
                        finished=request.is_finished,
                        num_cached_tokens=request.num_cached_tokens,
                        delta_text=delta,
                        delta_token_ids=delta_ids,
                        error=request.error,
                    )
                )
            else:
                parent = self._parents[request.parent_id]
                parent.completions[request.index] = completion
                parents[parent.request_id] = parent
            if request.is_finished:
                self._detok.pop(request.request_id, None)
        for parent in parents.values():
            if parent.output_kind == RequestOutputKind.FINAL_ONLY and not parent.finished:
                continue
            outputs.append(parent.output())
            if parent.finished:
                del self._parents[parent.request_id]
        return outputs

    def _completion(self, request: Request, delta: str, delta_ids: list[int]) -> CompletionOutput:
        """One completion as the caller sees it: whole (`CUMULATIVE`, `FINAL_ONLY`), or only
        what this step added (`DELTA`: text, token ids and logprobs alike)."""
        params = request.sampling_params
        if params.output_kind == RequestOutputKind.DELTA:
            text, token_ids = delta, delta_ids
            entries = request.logprobs[len(request.logprobs) - len(delta_ids) :]
        else:
            state = self._detok.get(request.request_id)
            text, token_ids = (state.text if state else ""), list(request.output_token_ids)
            entries = request.logprobs
        logprobs = None
        if params.logprobs is not None:
            logprobs = [{t: Logprob(lp) for t, lp in entry.items()} for entry in entries]
        return CompletionOutput(
            index=request.index,
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=str(request.finish_reason) if request.finish_reason else None,
            stop_reason=request.stop_reason,
            delta_text=delta,
            delta_token_ids=delta_ids,
        )

    def _summary(self, sched: SchedulerOutput, forward_time: float) -> StepSummary:
        kv = self.kv_cache_manager
        scheduled = {s.request.request_id: s.num_new_tokens for s in sched.scheduled}
        num_decode = sum(s.num_new_tokens for s in sched.scheduled if not s.is_prefill)
        return StepSummary(
            step=sched.step,
            scheduled=scheduled,
            num_prefill_tokens=sched.num_scheduled_tokens - num_decode,
            num_decode_tokens=num_decode,
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            num_used_blocks=kv.num_used_blocks,
            num_cached_free_blocks=kv.num_cached_free_blocks,
            num_free_blocks=kv.num_free_blocks,
            num_allocated_slots=kv.num_allocated_slots(),
            num_filled_slots=kv.num_filled_slots(),
            schedule_time=sched.schedule_time,
            forward_time=forward_time,
            num_preempted=len(sched.preempted),
            token_budget=self.config.max_num_batched_tokens,
            free_queue_head=tuple(kv.free_block_queue.peek(8)),
            rank_forward_times=self._rank_forward_times(),
        )

    def _rank_forward_times(self) -> tuple[float, ...]:
        """Each rank's forward time of the last step (a round trip to every rank: only asked
        when someone listens to events)."""
        if self.group is None:
            return (self.runner.rank_forward_time(),)
        return tuple(self.group.run_all("rank_forward_time"))

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
