"""nanovllm under test: `LLMEngine.step()` in a loop (steploop.py), every step measured.

The plug-in drives the engine as `LLM.generate` does (all requests in, step until done), or,
online, adds each request once its arrival time has passed. Each token's time is taken when
`step()` returns it.

Per step it keeps what the engine measures (`LLMEngine.stats.last`, `engine/stats.py`: the
schedule, input-preparation, forward and sample times and the step's shape) and the KV cache's
allocated and filled slots. These steps feed the overhead breakdown and the KV memory figures
(analysis.py). The plug-in does not subscribe to the event bus: with a subscriber the engine
builds an event for every block operation, which would inflate the very overhead measured.

Between runs the prefix cache is emptied (and a KV connector's store with it:
`LLMEngine.reset_prefix_cache`), so a repeat never finds the previous repeat's prompts. Each run
keeps the prompt tokens found cached: in the device pool (`EngineStats.prefix_cache_hits`), from
a KV connector (`external_prefix_cache_hits`), and per request (`RequestOutput.num_cached_tokens`).

With `--speculative-config` the engine speculates (`EngineLimits.speculative_config`), and each
run also keeps its speculative decoding counts (`EngineStats.spec_decoding`, over that run alone);
`nanovllm-no-spec` is the same engine without speculation, the other side of the comparison.

With `--kv-transfer-config` the engine runs a KV connector (`EngineLimits.kv_transfer_config`,
`nanovllm/kv_transfer/`); `nanovllm-no-kv-transfer` is the same engine without it.
`run_conversations` serves the multi-turn workload (multi_turn.py), whose prompts are built from
the answers as they come.

A GGUF file's weights: `nanovllm` dequantizes them to float32 at load (`dequantize_gguf=True`),
the weights the peers given a folder (vLLM, transformers) read, so their rows compare engines, not
weight formats; `nanovllm-gguf` keeps them quantized as stored (the engine's own default for a
GGUF file, `backends/cpu_quantized.py`: the float32 C kernel where it builds, else numba's;
its configuration names which), the row to set beside llama.cpp's on the same file;
`nanovllm-gguf-int8` also rounds x to int8 blocks (`gguf_int8_activations=True`), as llama.cpp
does, for integer dot products (AMX where the CPU has it, `backends/cpu_quantized_int8.py`).

`nanovllm-compiled` is the engine with `enforce_eager=False` (its layers compiled by
torch.compile at load, `backends/compilation.py`); its load info keeps the compile time, and the
report prints it with its step-time breakdown beside nanovllm's.
"""

from __future__ import annotations

import time

from nanovllm.bench.engines import Engine, TokenCallback
from nanovllm.bench.multi_turn import MultiTurnWorkload, drive_conversations
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.steploop import drive
from nanovllm.bench.workload import Workload
from nanovllm.engine.stats import StepStats


class NanovllmEngine(Engine):
    name = "nanovllm"
    enable_prefix_caching = True
    speculate = True  # with the limits' speculative_config, if one is given
    parallel = True  # with the limits' tensor_parallel_size
    enforce_eager = True  # False: compile the model's layers at load
    kv_transfer = True  # with the limits' kv_transfer_config, if one is given
    dequantize_gguf = True  # a GGUF file's weights as float32, as the folder the peers read
    gguf_int8_activations = False  # True: x rounded to int8 blocks (AMX or VNNI kernels)

    def load(self) -> dict:
        from nanovllm.config import EngineConfig
        from nanovllm.engine.llm_engine import LLMEngine
        from nanovllm.models.gguf_loader import is_gguf

        tp = self.limits.tensor_parallel_size if self.parallel else 1
        threads = self.limits.threads

        config = EngineConfig(
            model=self.model_path,
            num_kv_blocks=self.limits.num_kv_blocks,
            enable_prefix_caching=self.enable_prefix_caching,
            speculative_config=self.limits.speculative_config if self.speculate else None,
            kv_transfer_config=self.limits.kv_transfer_config if self.kv_transfer else None,
            tensor_parallel_size=tp,
            enforce_eager=self.enforce_eager,
            dtype="float32",
            dequantize_gguf=self.dequantize_gguf,
            gguf_int8_activations=self.gguf_int8_activations,
            # The ranks share the bench's threads (unset: the engine divides the machine's).
            num_threads=max(threads // tp, 1) if threads else None,
            **self.limits.shared(),
        )
        self.engine = engine = LLMEngine(config)
        self._runs = 0
        import torch

        weights = ""
        if is_gguf(self.model_path):
            kept = "kept quantized as stored" if not self.dequantize_gguf else "float32"
            kept += ", x rounded to int8 blocks" if self.gguf_int8_activations else ""
            if not self.dequantize_gguf and engine.started_event.attention_backend == "cpu":
                from nanovllm.backends.cpu_quantized import quantized_kernel_name

                kept += f", {quantized_kernel_name(self.gguf_int8_activations)}"
            weights = f"GGUF weights {kept}, "
        configuration = (
            f"{weights}{torch.get_num_threads()} torch threads, attention backend "
            f"{engine.started_event.attention_backend!r}, "
            f"{'enforce_eager' if self.enforce_eager else 'torch.compile'}, "
            f"{engine.num_kv_blocks} KV blocks of {config.block_size}, max_num_seqs "
            f"{config.max_num_seqs}, max_num_batched_tokens {config.max_num_batched_tokens}"
        )
        return {
            "configuration": configuration,
            "num_kv_blocks": engine.num_kv_blocks,
            "block_size": config.block_size,
            "max_model_len": engine.max_model_len,
            "enable_prefix_caching": config.enable_prefix_caching,
            "speculative_config": config.speculative_config,
            "kv_transfer_config": config.kv_transfer_config,
            "tensor_parallel_size": config.tensor_parallel_size,
            "attention_backend": engine.started_event.attention_backend,
            "device": engine.stats.device,
            # Seconds torch.compile took at load; None when eager (or when compiling failed).
            "compile_s": engine.stats.compile_seconds,
        }

    def _draft_time(self, step: StepStats) -> float:
        drafting = self.engine.started_event.speculative_method == "draft_model"
        return step.propose_time if drafting else 0.0

    def _step_record(self, wall: float) -> dict:
        """One step as the bench saw it: seconds per part, the step's shape, KV slots."""
        engine, step = self.engine, self.engine.stats.last
        live = engine.stats.live
        return {
            "wall": wall,  # the whole step() call
            "schedule": step.schedule_time,
            "prepare": step.prepare_time,  # inside the runner's forward time
            # (with a draft model its forwards are model time too: the proposals)
            "model": step.forward_time - step.prepare_time + self._draft_time(step),
            "sample": step.sample_time,
            "num_tokens": step.num_scheduled_tokens,
            "num_prefill_tokens": step.num_prefill_tokens,
            "num_seqs": step.num_seqs,
            "num_running": step.num_running,
            "allocated_slots": live.num_allocated_slots,
            "filled_slots": live.num_filled_slots,
        }

    def _params(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None):
        from nanovllm.sampling_params import RequestOutputKind, SamplingParams

        return SamplingParams(
            temperature=temperature,
            max_tokens=max_tokens,
            ignore_eos=True,
            seed=seed,
            # As the vLLM worker asks of vLLM: token ids only, each step's new ones.
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _begin(self) -> tuple[str, list[dict], dict[str, int]]:
        """Empty the prefix cache (and a connector's store: `LLMEngine.reset_prefix_cache`);
        the run's request id prefix, its step records, and the counters at its start."""
        self.engine.reset_prefix_cache()
        self._runs += 1
        self._num_cached: dict[int, int] = {}  # request index -> RequestOutput.num_cached_tokens
        return f"r{self._runs}-", [], self._counters()

    def _counters(self) -> dict[str, int]:
        stats = self.engine.stats
        return {
            "prefix_cache_hits": stats.prefix_cache_hits,
            "external_prefix_cache_hits": stats.external_prefix_cache_hits,
            "num_preemptions": stats.num_preemptions,
        }

    def _step(self, prefix: str, steps: list[dict]) -> list[tuple[int, list[int]]]:
        """One engine step, recorded; (request index, new token ids) per request."""
        steps_before = self.engine.stats.num_steps
        start = time.perf_counter()
        outputs = self.engine.step()
        wall = time.perf_counter() - start
        if self.engine.stats.num_steps > steps_before:  # (a step that ran)
            steps.append(self._step_record(wall))
        produced = []
        for o in outputs:
            i = int(o.request_id[len(prefix) :])
            self._num_cached[i] = o.num_cached_tokens
            produced.append((i, o.outputs[0].token_ids))
        return produced

    def _extra(self, steps: list[dict], before: dict[str, int]) -> dict:
        return {
            "steps": steps,
            **{k: v - before[k] for k, v in self._counters().items()},
            # Per request (by index): prompt tokens it found cached at admission, local and
            # external together (`RequestOutput.num_cached_tokens`).
            "num_cached_tokens": [self._num_cached[i] for i in sorted(self._num_cached)],
        }

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        engine = self.engine
        prefix, steps, before = self._begin()
        spec_before = _spec_counts(engine)
        requests = workload.requests

        def add(i: int) -> None:
            r = requests[i]
            params = self._params(r.max_tokens, workload.temperature, r.seed)
            engine.add_request(f"{prefix}{i}", r.prompt_token_ids, params)

        arrivals = [r.arrival_s for r in requests]
        _, wall, tokens, times = drive(
            arrivals,
            add,
            lambda: self._step(prefix, steps),
            engine.has_unfinished_requests,
            on_tokens,
        )
        records = [
            RequestRecord(tokens[i][: r.max_tokens], times[i][: r.max_tokens], r.arrival_s)
            for i, r in enumerate(requests)
        ]
        extra = {
            **self._extra(steps, before),
            "spec": {k: v - spec_before[k] for k, v in _spec_counts(engine).items()},
        }
        return EngineRun(self.name, wall, records, extra)

    def run_conversations(
        self, workload: MultiTurnWorkload, on_tokens: TokenCallback | None = None
    ) -> EngineRun:
        """The multi-turn workload (multi_turn.py), greedy: each turn sent once the previous
        one is answered. A record's arrival is when its turn was sent; `extra["prompts"]` holds
        the prompts that were built."""
        prefix, steps, before = self._begin()

        def add(i: int, prompt: list[int], max_tokens: int) -> None:
            self.engine.add_request(f"{prefix}{i}", prompt, self._params(max_tokens))

        served = drive_conversations(workload, add, lambda: self._step(prefix, steps), on_tokens)
        records = [
            RequestRecord(tokens, times, sent)
            for tokens, times, sent in zip(served.tokens, served.times, served.sent)
        ]
        extra = {**self._extra(steps, before), "prompts": served.prompts}
        return EngineRun(self.name, served.wall_s, records, extra)

    def close(self) -> None:
        self.engine = None


def _spec_counts(engine) -> dict[str, int]:
    """The engine's speculative decoding counts so far (all 0 when it does not speculate)."""
    stats = engine.stats.spec_decoding
    return {
        "num_drafts": stats.num_drafts,
        "num_draft_tokens": stats.num_draft_tokens,
        "num_accepted_tokens": stats.num_accepted_tokens,
    }


class NanovllmNoPrefixEngine(NanovllmEngine):
    """nanovllm with prefix caching off: the other half of the prefix-caching experiment."""

    name = "nanovllm-no-prefix"
    enable_prefix_caching = False
    kv_transfer = False  # the OffloadingConnector needs the prefix cache


class NanovllmNoSpecEngine(NanovllmEngine):
    """nanovllm without speculative decoding: the other half of `--speculative-config`'s
    comparison."""

    name = "nanovllm-no-spec"
    speculate = False


class NanovllmNoKVTransferEngine(NanovllmEngine):
    """nanovllm without the KV connector: the other half of `--kv-transfer-config`'s
    comparison."""

    name = "nanovllm-no-kv-transfer"
    kv_transfer = False


class NanovllmOneRankEngine(NanovllmEngine):
    """nanovllm in one process: the other half of `--tensor-parallel-size`'s comparison."""

    name = "nanovllm-tp1"
    parallel = False


class NanovllmCompiledEngine(NanovllmEngine):
    """nanovllm with `enforce_eager=False`: torch.compile against the eager default."""

    name = "nanovllm-compiled"
    enforce_eager = False


class NanovllmGGUFEngine(NanovllmEngine):
    """nanovllm with a GGUF file's weights kept quantized as stored: beside llama.cpp's rows."""

    name = "nanovllm-gguf"
    dequantize_gguf = False


class NanovllmGGUFInt8Engine(NanovllmGGUFEngine):
    """nanovllm-gguf with x rounded to int8 blocks, llama.cpp's arithmetic: integer products."""

    name = "nanovllm-gguf-int8"
    gguf_int8_activations = True
