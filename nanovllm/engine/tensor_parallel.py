"""Running one model over N processes: tensor parallelism, as the engine starts it.

With `tensor_parallel_size=N` the engine starts N ranks (`distributed/worker_group.py`): rank
0 is the engine's own process, ranks 1..N-1 are worker processes (or, under `torchrun`, the
processes torchrun started, on one machine or several). Every rank builds a `ModelRunner` with
its shard of the model: its attention heads, its slice of the MLP and of the vocabulary
(`models/linear.py`, `models/embedding.py`), read from the checkpoint slice by slice
(`models/sharded_loader.py`), and a KV cache for its heads only, under the same block ids.

The scheduler and the KV cache manager stay single, on rank 0. Each step rank 0 prepares the
step's inputs once and sends them to every rank; all ranks run the forward pass together (their
layers meet in all-reduces); rank 0 alone samples (`TensorParallelExecutor`).

    torchrun --standalone --nproc-per-node 2 -m nanovllm generate "ROMEO:" \\
        --tensor-parallel-size 2                       # 2 processes on this machine
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m nanovllm serve --tensor-parallel-size 4     # the same on both machines

Without torchrun, `LLM(..., tensor_parallel_size=2)` starts its worker processes itself, with
the "spawn" method (a fresh interpreter, as CUDA requires), which imports the caller's script
again in each worker: as with vLLM, a script must be a file whose work sits under
`if __name__ == "__main__":`. Without it, each worker starts the engine again as it imports the
script, and multiprocessing ends it (its error only on the worker's stderr); the driver sees a
rank that died at start, without a word, and names the missing guard (`_unguarded_main`).
"""

from __future__ import annotations

import ast
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nanovllm.backends import get_backend
from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.distributed.parallel_state import as_tp_rank
from nanovllm.distributed.validation import check_device_count, check_tensor_parallel_size
from nanovllm.distributed.worker_group import WorkerDiedError, WorkerGroup
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.executor.prompt_logprobs import with_prompt_rows
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.models.gguf_loader import is_gguf
from nanovllm.models.loader import load_model
from nanovllm.models.model_layers import ModelLayers


@dataclass(frozen=True)
class RunnerSpec:
    """What every rank needs to build its runner (sent to the worker processes, so plain data)."""

    model_path: Path
    dtype: torch.dtype
    device_type: str
    attention_backend: str
    max_model_len: int
    block_size: int
    num_threads: int | None
    enforce_eager: bool = True  # False: compile the model's layers (`backends/compilation.py`)
    # The runner's parts (`engine/parts.py`): None, the backend's attention and the runner's
    # sampler. (Pickled to the workers: module-level ones with several ranks.)
    attention_cls: Callable | None = None
    step_inputs: Callable = step_inputs
    sampler: Callable | None = None
    # (attention class) -> the model's layers (`models/model_layers.py`; lesson 14's own)
    model_layers: Callable[[type], ModelLayers] = ModelLayers
    dequantize_gguf: bool = False  # True: a GGUF file's quantized weights become `dtype` at load
    gguf_int8_activations: bool = False  # (EngineConfig's)


def build_runner(rank: int, spec: RunnerSpec) -> ModelRunner:
    """Rank `rank`'s runner: its shard of the model (the process group is set up already),
    built from the backend's layers and prepared by it once loaded, and the backend's runner
    class for the device."""
    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    device = torch.device("cuda", rank) if spec.device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = get_backend(spec.attention_backend)
    layers = spec.model_layers(spec.attention_cls or backend.attention_class)
    layers = backend.model_layers(layers, spec.dtype, device, spec.enforce_eager)
    if not spec.dequantize_gguf and is_gguf(spec.model_path):
        layers = backend.quantized_layers(
            layers, spec.dtype, device, spec.enforce_eager, spec.gguf_int8_activations
        )
    model = load_model(spec.model_path, spec.dtype, device, layers, spec.max_model_len)
    backend.prepare_model(model, spec.enforce_eager)
    runner_class = backend.runner_class(device)
    builds_its_own = runner_class.prepare_inputs is not ModelRunner.prepare_inputs
    if spec.step_inputs is not step_inputs and builds_its_own:
        raise ValueError(
            f"the {spec.attention_backend!r} backend's runner ({runner_class.__name__}) builds "
            "its step inputs its own way: a step-input builder needs attention_backend='torch'"
        )
    return runner_class(
        model, spec.block_size, spec.dtype, device, sampler=spec.sampler,
        step_inputs=spec.step_inputs,
    )  # fmt: skip


class TensorParallelExecutor:
    """Rank 0's side of a step under tensor parallelism: the step's inputs are prepared here,
    once; `forward_logits` runs on every rank at the same time (`WorkerGroup.run`), whose layers
    meet in their all-reduces; the tokens are sampled here, on rank 0 alone. The one-process
    engine calls `ModelRunner.execute` instead, which does the same with one rank."""

    def __init__(self, runner: ModelRunner, group: WorkerGroup) -> None:
        self.runner = runner  # rank 0's
        self.group = group

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        start = time.perf_counter()
        inputs = with_prompt_rows(self.runner.prepare_inputs(out), out)
        self.runner.last_inputs = inputs  # (what the step's events tell: `step_events.py`)
        self.runner.last_prepare_time = time.perf_counter() - start
        logits = self.group.run("forward_logits", *inputs)
        self.runner.last_forward_time = time.perf_counter() - start
        return self.runner.sample(out, logits)


def forward_times(runner: ModelRunner, workers: WorkerGroup | None) -> list[float]:
    """Each rank's last forward pass (with workers, a round trip to each: asked only for the
    step's events)."""
    if workers is None:
        return [runner.forward_logits_time()]
    return workers.run_all("forward_logits_time")


def _check_main_is_importable() -> None:
    """Spawned workers import the caller's main script again: it must be a file."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.exists(main_file):
        raise RuntimeError(
            f"tensor_parallel_size > 1 starts worker processes that import the main script "
            f"again, and {main_file!r} is not a file: run the code from a script file (with its "
            "work under `if __name__ == '__main__':`), not from standard input"
        )


def _unguarded_main() -> str | None:
    """The main script's path when it is a file with no `if __name__ == "__main__":` at its top
    level (what every spawned worker runs again as it starts); None otherwise."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is None:
        return None
    try:
        tree = ast.parse(Path(main_file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return None
    return main_file


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or {"RANK", "WORLD_SIZE"} <= set(os.environ)


def start_runners(
    tensor_parallel_size: int, spec: RunnerSpec, model_args
) -> tuple[ModelRunner, WorkerGroup | None]:
    """Rank 0's runner, and the group of all ranks (None with a single rank)."""
    tp = tensor_parallel_size
    check_tensor_parallel_size(
        tp, model_args.num_attention_heads, model_args.num_key_value_heads,
        model_args.intermediate_size,
    )  # fmt: skip
    if tp == 1:
        # Alone, even in a process that holds another engine's group (the bench compares 2 ranks
        # with 1): each layer fixes its group size when built and communicates only above 1.
        with as_tp_rank(0, 1):
            return build_runner(0, spec), None
    factory = functools.partial(build_runner, spec=spec)
    if under_torchrun():
        world_size = int(os.environ["WORLD_SIZE"])
        if world_size != tp:
            raise ValueError(
                f"tensor_parallel_size={tp} but torchrun started WORLD_SIZE={world_size} "
                "processes: they must be equal"
            )
        group = WorkerGroup.from_torchrun(factory, device_type=spec.device_type)
    else:
        check_device_count(tp, spec.device_type)
        _check_main_is_importable()
        try:
            group = WorkerGroup(tp, factory, device_type=spec.device_type)
        except WorkerDiedError as exc:
            script = _unguarded_main()
            if script is None or exc.reason != "exited with code 1":
                raise
            # A rank that died as it started, without a traceback of ours: multiprocessing's
            # refusal to start the engine again from a worker that is importing the script.
            raise RuntimeError(
                f"{exc}: the script {script!r} starts the engine at its top level, without "
                '`if __name__ == "__main__":`. With tensor_parallel_size > 1 each rank is a '
                "fresh interpreter (multiprocessing's spawn) that imports the script first, and "
                "so started the engine again. Put the script's work under "
                '`if __name__ == "__main__":` (the rank\'s own error is on stderr above)'
            ) from exc
    return group.driver_worker, group
