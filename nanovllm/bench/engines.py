"""The one interface every compared engine keeps, and the registry of engines by name.

An engine plug-in is a class with three methods, so the suite treats them all alike:

    engine.load()          load weights, allocate caches, start processes; never timed -> info
    engine.run(workload)   one timed pass over the workload -> EngineRun (records.py)
    engine.close()         free what it holds (a subprocess, a background thread)

`run` starts its clock when the first request could be submitted and stops it at the last
token; it honours each request's `arrival_s` (online runs) and returns only the tokens each
request asked for, with EOS ignored. A warm-up is a `run` whose result is thrown away.
`on_tokens(n)` moves the progress bar; a plug-in that cannot see tokens as they come (vLLM in
its own process) reports them all at the end. A plug-in that cannot run here (not installed,
failed to start) raises `EngineUnavailable`, and the suite reports it as skipped, with why.

Every engine is sized by the same `EngineLimits`, nanovllm's own, so that each peer schedules
under the same limits as far as it has the knob (see each plug-in's docstring).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from nanovllm.bench.records import EngineRun
from nanovllm.bench.workload import Workload

TokenCallback = Callable[[int], None]

# name -> "module:Class" (imported only when asked for) or an Engine subclass (a test's fake).
ENGINES: dict[str, str | type] = {
    "nanovllm": "nanovllm.bench.engine_nanovllm:NanovllmEngine",
    "nanovllm-no-prefix": "nanovllm.bench.engine_nanovllm:NanovllmNoPrefixEngine",
    "nanovllm-no-spec": "nanovllm.bench.engine_nanovllm:NanovllmNoSpecEngine",
    "nanovllm-no-kv-transfer": "nanovllm.bench.engine_nanovllm:NanovllmNoKVTransferEngine",
    "nanovllm-tp1": "nanovllm.bench.engine_nanovllm:NanovllmOneRankEngine",
    "nanovllm-compiled": "nanovllm.bench.engine_nanovllm:NanovllmCompiledEngine",
    "nanovllm-gguf": "nanovllm.bench.engine_nanovllm:NanovllmGGUFEngine",
    "nanovllm-gguf-int8": "nanovllm.bench.engine_nanovllm:NanovllmGGUFInt8Engine",
    "hf-static": "nanovllm.bench.engine_hf:HFStaticEngine",
    "hf-cb": "nanovllm.bench.engine_hf:HFContinuousBatchingEngine",
    "one-at-a-time": "nanovllm.bench.engine_hf:OneAtATimeEngine",
    "vllm": "nanovllm.bench.engine_vllm:VLLMEngine",
    "vllm-default": "nanovllm.bench.engine_vllm:VLLMDefaultEngine",
    "vllm-compiled": "nanovllm.bench.engine_vllm:VLLMCompiledEngine",
    # llama.cpp's llama-server on the same GGUF file, in its own CPU configuration
    "llamacpp": "nanovllm.bench.engine_llamacpp:LlamaCppEngine",
    "llamacpp-batched": "nanovllm.bench.engine_llamacpp_batched:LlamaCppBatchedEngine",
    "llamacpp-bench": "nanovllm.bench.engine_llamacpp_bench:LlamaCppBenchEngine",
}


@dataclass
class EngineLimits:
    """The sizes every engine runs under: nanovllm's, mirrored by the peers."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    max_model_len: int = 1024
    num_kv_blocks: int | None = None  # None: nanovllm sizes its cache; the suite copies it here
    kv_cache_bytes: int | None = None  # nanovllm's KV cache in bytes, set once it has loaded
    threads: int | None = None  # torch / OpenMP threads
    seed: int = 0
    hf_batch_size: int = 64  # static batch size (the suite calibrates it)
    vllm_python: str | None = None  # the interpreter of vLLM's own virtualenv
    # nanovllm's speculative decoding (`--speculative-config`); the peers do not speculate
    speculative_config: dict | None = None
    # nanovllm's KV connector (`--kv-transfer-config`), compared with nanovllm-no-kv-transfer
    kv_transfer_config: dict | None = None
    # nanovllm's tensor parallelism (`--tensor-parallel-size`), compared with nanovllm-tp1
    tensor_parallel_size: int = 1

    # The sizes nanovllm and vLLM both take, under the same (vLLM's) names.
    SHARED = ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len", "seed")

    def shared(self) -> dict:
        return {name: getattr(self, name) for name in self.SHARED}


class EngineUnavailable(RuntimeError):
    """This engine cannot run here; the suite reports it as skipped."""


class Engine:
    """The base class of the plug-ins; `name` is the engine's name in the table."""

    name = "engine"

    def __init__(self, model_path: str, limits: EngineLimits) -> None:
        self.model_path = model_path
        self.limits = limits

    def load(self) -> dict:
        raise NotImplementedError

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        raise NotImplementedError

    def close(self) -> None:
        pass


def make_engine(name: str, model_path: str, limits: EngineLimits) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")
    plugin = ENGINES[name]
    if isinstance(plugin, str):
        module, cls = plugin.split(":")
        plugin = getattr(importlib.import_module(module), cls)
    return plugin(model_path, limits)
