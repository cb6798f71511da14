"""The composition root: from an `EngineConfig` to the finished parts an `LLMEngine` runs on.

Everything the step loop (`llm_engine.py`) runs on is made here, once, in this order:

1. the checkpoint's shape (`config.json`) and `max_model_len`, checked against it;
2. the device, the dtype, and the backend, the one choice of fast paths (`nanovllm/backends/`);
3. with speculative decoding, the proposer (an n-gram search, or a draft model and its runner);
4. the runner on every rank (`tensor_parallel.py`): the model loaded in its dtype on its device,
   given the backend's layers, and the backend's runner class; with several ranks, the executor
   that runs a step on all of them;
5. the KV budget: as many blocks as every rank can hold (a fixed budget on a CPU, measured on a
   GPU, `executor/memory.py`), no more than every sequence could use at full length;
6. the KV cache allocated on every rank (and the draft's, with the same block ids), then, on a
   GPU with `enforce_eager=False`, the decode steps captured as CUDA graphs;
7. with a KV connector (`kv_transfer/`), its worker side given the KV cache, around the step;
8. the executor wrapped so that it tells its step as events while someone subscribes
   (`executor/step_events.py`);
9. the KV cache manager, and the scheduler's KV source: the connector's scheduler side, or the
   `NullConnector`, which supplies nothing (`core/kv_source.py`);
10. the speculator (`spec_decode/speculator.py`; `NoSpeculation` without a proposer), then the
    scheduler: the parts' one, or with async scheduling the one that schedules a step ahead;
11. the input and output processors, and the logits-mask source (structured outputs' grammar
    bitmask, `structured_output/manager.py`), called once a step is scheduled;
12. the step loop, chosen once (vLLM's `step_fn`): the engine's own, or async scheduling's
    overlapped one (`async_step.py`).

Steps 1-8 give `EngineSetup`, the model on its ranks; 9-12 `EngineCore`, the finished parts that
`LLMEngine` keeps. Nothing here runs a step.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nanovllm.backends import get_backend, pick_backend
from nanovllm.config import EngineConfig
from nanovllm.core.async_scheduler import AsyncScheduler
from nanovllm.core.extra_tokens import ExtraTokens
from nanovllm.core.kv_cache_interface import (
    KVCacheConfig,
    SlidingWindowSpec,
    get_kv_cache_config,
    layer_specs,
)
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.kv_source import NullConnector
from nanovllm.core.logits_mask import LogitsMask, NoLogitsMask
from nanovllm.core.scheduler import Scheduler, SchedulerOutput
from nanovllm.distributed.worker_group import WorkerGroup
from nanovllm.engine.async_step import AsyncStep
from nanovllm.engine.eos import eos_token_ids
from nanovllm.engine.input_processor import InputProcessor
from nanovllm.engine.output_processor import OutputProcessor
from nanovllm.engine.parts import EngineParts
from nanovllm.engine.stats import EngineStats, LiveFigures
from nanovllm.engine.tensor_parallel import (
    RunnerSpec,
    TensorParallelExecutor,
    start_runners,
)
from nanovllm.events import EngineStarted, EventBus, KVCacheGroupInfo
from nanovllm.executor.memory import (
    CPU_KV_CACHE_CAP,
    CPU_KV_CACHE_FRACTION,
    available_cpu_memory,
    cpu_kv_cache_budget,
    kv_bytes_per_block,
)
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.step_events import ObservedExecutor
from nanovllm.kv_transfer.base import KVConnectorBase, KVConnectorRole
from nanovllm.kv_transfer.executor import KVConnectorExecutor
from nanovllm.kv_transfer.factory import checked_config, create_connector
from nanovllm.kv_transfer_config import KVTransferConfig
from nanovllm.models.loader import (
    load_model_args,
    load_tokenizer,
    resolve_dtype,
    resolve_model_path,
)
from nanovllm.models.model_args import ModelArgs
from nanovllm.models.model_layers import ModelLayers
from nanovllm.spec_decode.draft_executor import DraftKVExecutor
from nanovllm.spec_decode.draft_model_proposer import DraftModelProposer
from nanovllm.spec_decode.metrics import SpecDecodingStats
from nanovllm.spec_decode.ngram_proposer import NgramProposer
from nanovllm.spec_decode.speculator import NoSpeculation, Speculator, speculator_for
from nanovllm.speculative_config import SpeculativeConfig
from nanovllm.structured_output.manager import grammar_bitmask

logger = logging.getLogger("nanovllm")


def default_model_path() -> Path:
    import nanovllm.default_model

    return Path(nanovllm.default_model.__file__).parent


@dataclass
class EngineSetup:
    """The model on its ranks (steps 1-8 of the module docstring)."""

    model_path: Path
    model_args: ModelArgs
    max_model_len: int
    device: torch.device
    dtype: torch.dtype
    attention_backend: str
    tokenizer: object
    eos_token_ids: frozenset[int]
    speculative_config: SpeculativeConfig | None
    proposer: NgramProposer | DraftModelProposer | None
    runner: ModelRunner  # rank 0's
    group: WorkerGroup | None  # every rank, with tensor parallelism
    # `execute(sched)`; wrapped in an `ObservedExecutor` when the engine gives its event bus
    executor: Any  # ModelRunner, TensorParallelExecutor, or one wrapped around them
    num_kv_blocks: int
    kv_transfer_config: KVTransferConfig | None = None
    kv_connector_worker: KVConnectorBase | None = None  # the connector's worker side
    tokenizer_path: Path | None = None  # where the tokenizer came from (the model's own: None)
    parts: EngineParts = field(default_factory=EngineParts)  # what the engine is built from
    # The layers' KV cache groups (`core/kv_cache_interface.py`; None: one, every layer full)
    kv_cache_config: KVCacheConfig | None = None

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past each request's step for the draft model's proposals."""
        return self.speculative_config.num_lookahead_tokens if self.speculative_config else 0

    @property
    def model_tag(self) -> str:
        """Names this model's KV outside the engine: the checkpoint folder and the dtype."""
        return f"{self.model_path.name}-{str(self.dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class EngineCore:
    """The finished parts an `LLMEngine` keeps (steps 9-12 of the module docstring)."""

    setup: EngineSetup  # the model on its ranks
    executor: Any  # runs a step on every rank (`EngineSetup.executor`)
    workers: WorkerGroup | None  # every rank, with tensor parallelism (`EngineSetup.group`)
    events: EventBus
    stats: EngineStats  # figures about the steps, filled once per step
    started_event: EngineStarted  # what a subscriber hears first
    kv_cache_manager: KVCacheManager
    kv_source: KVConnectorBase | NullConnector  # the scheduler's KV source
    speculator: Speculator | NoSpeculation  # proposes after each step
    scheduler: Scheduler
    input_processor: InputProcessor
    output_processor: OutputProcessor
    logits_mask: Callable[[SchedulerOutput], LogitsMask]  # the step's, once scheduled
    async_loop: AsyncStep | None  # the overlapped step loop (None: the engine's own)


def build_engine(config: EngineConfig) -> EngineCore:
    """The steps of the module docstring."""
    events = EventBus()
    setup = set_up_engine(config, events)  # 1-8
    parts, lookahead = setup.parts, setup.num_lookahead_tokens
    # 9. the KV cache manager and the scheduler's KV source
    kv = parts.kv_cache_manager_cls(
        setup.num_kv_blocks, config.block_size, config.enable_prefix_caching, events,
        parts.free_block_queue, kv_cache_config=setup.kv_cache_config,
        sliding_window_manager=parts.sliding_window_manager,
    )  # fmt: skip
    kv_source = connector(setup, KVConnectorRole.SCHEDULER, events) or NullConnector()
    # 10. the speculator, then the scheduler (and the statistics, counting both)
    spec_decoding = SpecDecodingStats()
    speculator = speculator_for(setup.proposer, spec_decoding)
    extra_tokens = ExtraTokens(speculator.tokens_to_verify, lookahead)
    scheduler = scheduler_class(parts, config.async_scheduling)(
        config, kv, events, kv_source, extra_tokens
    )
    compiled = getattr(setup.runner.model, "compile_seconds", None)
    stats = EngineStats(
        spec_decoding=spec_decoding,
        live=LiveFigures(scheduler, kv),
        device=str(setup.device),
        compile_seconds=compiled,
    )
    # 11. the output and input processors (the logits mask: at the end)
    output_processor = OutputProcessor(setup.tokenizer, events, parts.detokenizer)

    def is_known(request_id: str) -> bool:  # (a request, or a parent of n > 1 children)
        return request_id in scheduler.requests or request_id in output_processor.parent_requests

    input_processor = InputProcessor(
        setup.tokenizer,
        vocab_size=setup.model_args.vocab_size,
        max_model_len=setup.max_model_len,
        num_kv_blocks=setup.num_kv_blocks - setup.kv_cache_config.has_sliding_window,  # (null)
        block_size=config.block_size,
        num_lookahead_tokens=lookahead,
        blocks_needed=functools.partial(
            setup.kv_cache_config.max_blocks_needed,
            block_size=config.block_size,
            max_step_slots=lookahead
            + (
                config.max_num_batched_tokens
                if config.enable_chunked_prefill
                else setup.max_model_len
            ),
        ),
        eos_token_ids=setup.eos_token_ids,
        seed=config.seed,
        events=events,
        is_known=is_known,
    )
    # 12. the step loop: None is the engine's own
    async_loop = None
    if config.async_scheduling:
        async_loop = AsyncStep(scheduler, setup.runner, events, setup.attention_backend, stats)
    return EngineCore(
        setup, setup.executor, setup.group, events, stats, started_event(config, setup), kv,
        kv_source, speculator, scheduler, input_processor, output_processor,
        functools.partial(step_logits_mask, events=events), async_loop,
    )  # fmt: skip


def step_logits_mask(sched: SchedulerOutput, events: EventBus) -> LogitsMask:
    """The step's logits mask: its structured rows' grammars (`structured_output/`), if any."""
    mask = grammar_bitmask(sched, events)
    return NoLogitsMask() if mask is None else mask


def scheduler_class(parts: EngineParts, async_scheduling: bool) -> Callable[..., Scheduler]:
    """The parts' Scheduler, or with async scheduling the one that schedules a step ahead."""
    if not async_scheduling:
        return parts.scheduler_cls
    if parts.scheduler_cls is not Scheduler:
        raise ValueError("async_scheduling=True cannot run a given scheduler_cls part")
    return AsyncScheduler


def started_event(config: EngineConfig, setup: EngineSetup) -> EngineStarted:
    """The engine's description, the first event every subscriber receives."""
    spec, kv_transfer = setup.speculative_config, setup.kv_transfer_config
    kv_config = setup.kv_cache_config
    return EngineStarted(
        model=setup.model_path.name,
        num_kv_blocks=setup.num_kv_blocks,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=setup.max_model_len,
        enable_prefix_caching=config.enable_prefix_caching,
        enable_chunked_prefill=config.enable_chunked_prefill,
        attention_backend=setup.attention_backend,
        tensor_parallel_size=config.tensor_parallel_size,
        speculative_method=spec and spec.method,
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        kv_connector=kv_transfer and kv_transfer.kv_connector,
        kv_role=kv_transfer and kv_transfer.kv_role,
        num_tier_blocks=getattr(setup.kv_connector_worker, "num_cpu_blocks", 0),
        kv_cache_groups=kv_cache_group_infos(setup.kv_cache_config),
        # The pool hands its first block, 0, to the null block (`core/block_pool.py`).
        null_block=0 if kv_config and kv_config.has_sliding_window else None,
    )


def kv_cache_group_infos(kv_config: KVCacheConfig | None) -> tuple[KVCacheGroupInfo, ...]:
    """Each KV cache group's kind, window and layers, as `EngineStarted` names them."""
    if kv_config is None:
        return ()
    return tuple(
        KVCacheGroupInfo(
            "sliding" if isinstance(g.kv_cache_spec, SlidingWindowSpec) else "full",
            getattr(g.kv_cache_spec, "sliding_window", None),
            tuple(g.layer_indices),
        )
        for g in kv_config.kv_cache_groups
    )


def connector(
    setup: EngineSetup, role: KVConnectorRole, events: EventBus | None = None
) -> KVConnectorBase | None:
    """One side of the configured KV connector (None without one)."""
    if setup.kv_transfer_config is None:
        return None
    config, block_size = setup.kv_transfer_config, setup.runner.block_size
    return create_connector(
        config, role, block_size, setup.model_tag, events, setup.parts.host_tier_cls
    )


def on_every_rank(setup: EngineSetup, method: str, *args, all: bool = False):
    """Call a runner method on every rank (just here without tensor parallelism): rank 0's
    result, or with `all` every rank's in rank order."""
    if setup.group is None:
        result = getattr(setup.runner, method)(*args)
        return [result] if all else result
    return setup.group.run_all(method, *args) if all else setup.group.run(method, *args)


def check_max_model_len(config: EngineConfig, args: ModelArgs) -> int:
    """`max_model_len` (default: the model's), and ValueErrors naming what does not fit."""
    max_model_len = config.max_model_len or args.max_position_embeddings
    if max_model_len > args.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's limit "
            f"(max_position_embeddings={args.max_position_embeddings})"
        )
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens={config.max_num_batched_tokens} is smaller than "
            f"max_model_len={max_model_len}; without chunked prefill a whole prompt must "
            "fit in one step"
        )
    return max_model_len


def expert_parallel_parts(parts: EngineParts, args) -> EngineParts:
    """`parts` whose model layers spread each mixture of experts' experts over the ranks."""
    from nanovllm.models.moe_expert_parallel import expert_parallel_layers

    if not args.num_experts:
        raise ValueError(
            f"enable_expert_parallel=True, but {args.architecture} has no mixture of experts"
        )
    if parts.model_layers is not ModelLayers:
        raise ValueError("enable_expert_parallel=True with parts' own model_layers (give one)")
    return dataclasses.replace(parts, model_layers=expert_parallel_layers)


def set_up_engine(config: EngineConfig, events: EventBus | None = None) -> EngineSetup:
    """Steps 1-8 of the module docstring."""
    kv_transfer_config = None
    if config.kv_transfer_config is not None:  # (its connector's checks, before any loading)
        kv_transfer_config = checked_config(config.kv_transfer_config)
    path = resolve_model_path(config.model) if config.model else default_model_path()
    hf_config, args = load_model_args(path)
    max_model_len = check_max_model_len(config, args)

    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = resolve_dtype(config.dtype, hf_config, device)
    if config.num_threads and device.type == "cpu":
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    backend_name = pick_backend(config.attention_backend, device, dtype)
    backend = get_backend(backend_name)
    backend.check_supported(config.block_size, args.head_dim)
    tokenizer_path = resolve_model_path(config.tokenizer) if config.tokenizer else path
    tokenizer = load_tokenizer(tokenizer_path)

    tp = config.tensor_parallel_size
    threads = config.num_threads
    if tp > 1 and not threads and device.type == "cpu":
        threads = max(torch.get_num_threads() // tp, 1)  # ranks share the machine's cores
    parts = config.parts or EngineParts()  # (`parts.py`: the runner's go to every rank)
    if config.enable_expert_parallel:
        parts = expert_parallel_parts(parts, args)
    spec = RunnerSpec(
        path, dtype, device.type, backend_name, max_model_len, config.block_size, threads,
        config.enforce_eager, parts.attention_cls, parts.step_inputs, parts.sampler,
        parts.model_layers, config.dequantize_gguf, config.gguf_int8_activations,
    )  # fmt: skip
    speculative_config = proposer = draft = None
    if config.speculative_config is not None:
        speculative_config = SpeculativeConfig.from_dict(config.speculative_config)
        proposer = load_proposer(speculative_config, spec, args, tokenizer)
        if isinstance(proposer, DraftModelProposer):
            draft = proposer.runner
    runner, group = start_runners(tp, spec, args)
    executor = runner if group is None else TensorParallelExecutor(runner, group)
    if draft is not None:  # the draft's pass over every step's tokens, beside the target's
        executor = DraftKVExecutor(executor, runner, draft)
    setup = EngineSetup(
        path, args, max_model_len, device, dtype, backend_name, tokenizer,
        eos_token_ids(path, hf_config, tokenizer), speculative_config, proposer, runner, group,
        executor, num_kv_blocks=0, tokenizer_path=tokenizer_path if config.tokenizer else None,
        parts=parts,
    )  # fmt: skip
    setup.kv_cache_config = kv_cache_config_for(config, args, draft is not None)
    graphs = wants_cuda_graphs(config, setup, backend.captures_cuda_graphs())
    setup.num_kv_blocks = num_kv_blocks(config, setup, graphs)
    on_every_rank(setup, "allocate_kv_cache", setup.num_kv_blocks, setup.kv_cache_config)
    if draft is not None:
        draft.allocate_kv_cache(setup.num_kv_blocks)  # the same block ids
    if graphs:
        capture_decode_graphs(config, setup)
    if kv_transfer_config is not None:
        setup.kv_transfer_config = kv_transfer_config
        worker = setup.kv_connector_worker = connector(setup, KVConnectorRole.WORKER)
        draft_caches = draft.kv_caches if draft is not None else []
        worker.register_kv_caches(runner.kv_caches + draft_caches)  # (the draft's KV moves too)
        setup.executor = KVConnectorExecutor(setup.executor, worker)
    if events is not None:  # the executor's stages as events, while someone subscribes
        setup.executor = ObservedExecutor(setup.executor, runner, events, backend_name)
    capacity = setup.num_kv_blocks * config.block_size
    logger.info(
        "nanovllm: %s on %s (%s), attention backend %r; KV cache size: %d tokens "
        "(%d blocks x %d); maximum concurrency for %d tokens per request: %.2fx",
        path.name, device, str(dtype).removeprefix("torch."), backend_name, capacity,
        setup.num_kv_blocks, config.block_size, max_model_len, capacity / max_model_len,
    )  # fmt: skip
    return setup


def load_proposer(
    spec: SpeculativeConfig, target: RunnerSpec, target_args: ModelArgs, target_tokenizer
) -> NgramProposer | DraftModelProposer:
    """The n-gram proposer, or the draft model, checked and loaded like the target (its dtype,
    device, backend and block size), alone on one rank even beside a tensor-parallel target."""
    k = spec.num_speculative_tokens
    if spec.method == "ngram":
        return NgramProposer(k, spec.prompt_lookup_min, spec.prompt_lookup_max)
    assert spec.model is not None
    folder = Path(spec.model)
    DraftModelProposer.check_draft(folder, target.max_model_len, target_args, target_tokenizer)
    _, draft_args = load_model_args(folder)
    draft_runner, _ = start_runners(1, dataclasses.replace(target, model_path=folder), draft_args)
    return DraftModelProposer(draft_runner, k)


def wants_cuda_graphs(config: EngineConfig, setup: EngineSetup, backend_captures: bool) -> bool:
    """Whether decode steps are to be captured as CUDA graphs: with `enforce_eager=False` on a
    GPU, where they can serve (otherwise this says why not, once)."""
    if config.enforce_eager or setup.device.type != "cuda":
        return False
    why_not = None
    if not backend_captures:
        why_not = f"attention backend {setup.attention_backend!r} (only 'triton' is captured)"
    elif setup.group is not None:
        why_not = "tensor parallelism"
    elif setup.kv_cache_config.num_groups > 1:
        why_not = "several KV cache groups (a block table each)"
    if why_not is not None:
        logger.warning("nanovllm: no CUDA graphs with %s; decode steps run eagerly", why_not)
        return False
    return True


def num_kv_blocks(config: EngineConfig, setup: EngineSetup, graphs: bool) -> int:
    """How many KV blocks, each with its slots in every layer (and, with a draft model, in
    every layer of the draft too: its cache has the same blocks)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = kv_bytes_per_block(
        setup.model_args, config.block_size, setup.dtype, config.tensor_parallel_size,
        setup.kv_cache_config.num_kv_tensors,
    )  # fmt: skip
    if isinstance(setup.proposer, DraftModelProposer):
        per_block += kv_bytes_per_block(
            setup.proposer.runner.model.args, config.block_size, setup.dtype
        )
    budget = config.kv_cache_memory_bytes
    if budget is None:  # the smallest any rank can give
        if setup.device.type == "cuda":  # measured (each rank holds its heads' share)
            budget = measure_kv_budget(config, setup, graphs)
        else:
            budget = cpu_kv_budget(config)
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(
            f"kv_cache_memory_bytes={budget} is too small for a single KV block "
            f"({per_block} bytes at block_size={config.block_size})"
        )
    # More than every sequence at full length could ever use is wasted memory (in every
    # group; with a sliding window, and its null block).
    max_len = setup.max_model_len + setup.num_lookahead_tokens
    kv_cache_config = setup.kv_cache_config
    useful = config.max_num_seqs * -(-max_len // config.block_size) * kv_cache_config.num_groups
    return int(min(blocks, useful + kv_cache_config.has_sliding_window))


def cpu_kv_budget(config: EngineConfig) -> int:
    """Each rank's KV budget on a CPU (`executor/memory.py`), logged: the ranks of one machine
    share its available memory."""
    available = available_cpu_memory()
    budget = cpu_kv_cache_budget(available // config.tensor_parallel_size)
    logger.info(
        "nanovllm: CPU KV cache budget %d MiB per rank (%.0f%% of %d MiB available, at most "
        "%d MiB; kv_cache_memory_bytes overrides it)",
        budget >> 20, CPU_KV_CACHE_FRACTION * 100, available >> 20, CPU_KV_CACHE_CAP >> 20,
    )  # fmt: skip
    return budget


def kv_cache_config_for(config: EngineConfig, args: ModelArgs, has_draft: bool) -> KVCacheConfig:
    """The layers' KV cache groups (`core/kv_cache_interface.py`), and ValueErrors for what
    cannot run with a sliding window's or several groups' block tables yet."""
    specs = layer_specs(
        args.layer_types, args.sliding_window, args.num_hidden_layers, config.block_size,
        config.disable_hybrid_kv_cache_manager,
    )  # fmt: skip
    kv_cache_config = get_kv_cache_config(specs)
    if kv_cache_config.num_groups > 1 or kv_cache_config.has_sliding_window:
        why_not = "a KV connector" if config.kv_transfer_config is not None else None
        why_not = "a draft model" if has_draft else why_not
        if why_not is not None:
            raise ValueError(
                f"{why_not} cannot run with a sliding-window KV cache yet (layer types "
                f"{sorted(set(args.layer_types))}); pass disable_hybrid_kv_cache_manager=True"
            )
    return kv_cache_config


def measure_kv_budget(config: EngineConfig, setup: EngineSetup, graphs: bool) -> int:
    """The KV budget measured on the GPU (`backends/gpu_memory.py`): one rank's runner, or the
    smallest of every rank's, each measuring its own at the same time (its method)."""
    from nanovllm.backends import gpu_memory

    args = (config, setup.max_model_len, graphs)
    if setup.group is None:
        return gpu_memory.measure_kv_budget(setup.runner, *args)
    if not hasattr(setup.runner, "measure_kv_budget"):
        raise ValueError(
            f"attention_backend={setup.attention_backend!r} with tensor_parallel_size > 1 on a "
            "GPU cannot measure the KV budget: give num_kv_blocks or kv_cache_memory_bytes"
        )
    return min(on_every_rank(setup, "measure_kv_budget", *args, all=True))


def capture_decode_graphs(config: EngineConfig, setup: EngineSetup) -> None:
    """Replay decode steps from CUDA graphs (`backends/cuda_graphs.py`); if capturing fails,
    say why, and run them eagerly."""
    runner = setup.runner
    max_blocks = -(-(setup.max_model_len + setup.num_lookahead_tokens) // config.block_size)
    try:
        seconds = runner.capture_decode_graphs(config.max_num_seqs, max_blocks)
    except Exception as exc:  # the model then runs as it would without graphs
        runner.graphs = None
        logger.warning(
            "nanovllm: capturing CUDA graphs failed (%s: %s); decode steps run eagerly",
            type(exc).__name__, exc,
        )  # fmt: skip
        return
    logger.info(
        "nanovllm: captured CUDA graphs for decode batches of %s requests in %.1f s",
        ", ".join(map(str, runner.graphs.batch_sizes)), seconds,
    )  # fmt: skip
