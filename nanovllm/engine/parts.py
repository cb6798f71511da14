"""EngineParts: the parts an engine is built from, given when it is built.

An engine is assembled from parts, each a class (or any callable with the class's constructor
signature) that the engine calls once, while it is built, to make the object it then uses as
its own. `EngineParts()` is the engine's own parts; a lesson's `--run` (`lessons/*/run.py`)
gives the learner's in their place, and nothing is assigned into an engine once it is built:

    LLM(model, parts=EngineParts(free_block_queue=MyFreeBlockQueue))
    LLMEngine(EngineConfig(model, parts=EngineParts(scheduler_cls=MyScheduler)))

The parts, what each is, its default, and the lesson that gives its own:

    free_block_queue      (blocks) -> the free block queue over every block      FreeBlockQueue, 03
    kv_cache_manager_cls  block tables, slots and prefix-cache lookups           KVCacheManager, 02, 08
    scheduler_cls         who runs each step (vLLM's EngineArgs.scheduler_cls)   Scheduler, 06 07 09
    step_inputs           (SchedulerOutput, block_size) -> the step's tensors    step_inputs, 02 09
    attention_cls         (heads, kv heads, head_dim, scale) -> a layer's        the backend's, 01 04 05
                          paged attention (None: the backend's)
    sampler               (draw=...) -> the sampler, which also verifies        the runner's, 10 13
                          proposed tokens (its `verifier`; None: the runner's)
    detokenizer           (tokenizer) -> the incremental detokenizer            IncrementalDetokenizer, 10
    host_tier_cls         (num_blocks) -> the OffloadingConnector's host tier    HostBlockTier, 15
                          (None: the connector's own)
    model_layers          (attention class) -> the classes the model's layers   ModelLayers, 14 17
                          are built from, its tensor-parallel linear layers
                          and mixtures of experts among them
                          (`models/model_layers.py`)
    sliding_window_manager
                          (spec, block pool, group id, events) -> a sliding     SlidingWindowManager, 16
                          window group's block tables, which free what the
                          window passed (`core/sliding_window_manager.py`)

`step_inputs` is the plain runner's: a backend whose runner keeps a persistent batch builds
its inputs its own way, and refuses another builder (a ValueError). With tensor parallelism,
the runner's parts and `model_layers` travel to every rank's process, so they must be
picklable (module-level classes and functions, or objects of such classes: lesson 14's
`YourModelLayers` holds only a file's path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nanovllm.core.free_block_queue import FreeBlockQueue
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.scheduler import Scheduler
from nanovllm.core.single_type_kv_cache_manager import SingleTypeKVCacheManager
from nanovllm.core.sliding_window_manager import SlidingWindowManager
from nanovllm.engine.detokenizer import IncrementalDetokenizer
from nanovllm.executor.sampler import Sampler
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.models.model_layers import ModelLayers


@dataclass(frozen=True)
class EngineParts:
    """The engine's parts (see the module docstring); each field defaults to the engine's own."""

    free_block_queue: Callable[[list], Any] = FreeBlockQueue
    kv_cache_manager_cls: Callable[..., KVCacheManager] = KVCacheManager
    scheduler_cls: Callable[..., Scheduler] = Scheduler
    step_inputs: Callable = step_inputs
    attention_cls: Callable | None = None
    sampler: Callable[..., Sampler] | None = None
    detokenizer: Callable[[Any], IncrementalDetokenizer] = IncrementalDetokenizer
    host_tier_cls: Callable[[int], Any] | None = None
    model_layers: Callable[[type], ModelLayers] = ModelLayers
    sliding_window_manager: type[SingleTypeKVCacheManager] = SlidingWindowManager


def default_parts() -> EngineParts:
    """The engine's own parts (`EngineConfig.parts`'s default)."""
    return EngineParts()
