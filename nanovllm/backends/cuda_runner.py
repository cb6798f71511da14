"""CudaModelRunner: the plain runner's step on a GPU, with what a GPU needs to run it well.

Three differences from `ModelRunner`, each for the same reason: the host should queue work and
go on, not wait for the GPU or make it wait.

- The step's inputs come from a persistent batch (`input_batch.py`) and go to the GPU in one
  copy through a reused pinned buffer (`staging.py`), not a transfer per tensor.
- The forward pass is timed by CUDA events recorded around it, read once the GPU has passed
  them, instead of a synchronize just to time it.
- With the Triton backend and `enforce_eager=False`, pure decode steps are replayed from CUDA
  graphs (`cuda_graphs.py`).

It also measures, before the KV cache exists, how much memory the largest step takes
(`peak_memory_of_step`, in `gpu_memory.py`, which measures the plain runner too), for the KV
budget (`nanovllm/executor/memory.py`).

The Triton backend uses it on a CPU too (its kernels then run in Triton's interpreter): there
nothing is copied and nothing is timed with events, and its graphs are "captured" by running
the step again (`capture_eagerly`), which is how the graphs' buffers are tested without a GPU.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from nanovllm.backends.cuda_graphs import Capture, DecodeGraphs, capture_cuda_graph
from nanovllm.backends.gpu_memory import measure_kv_budget, peak_memory_of_step, profile_step
from nanovllm.backends.input_batch import InputBatch
from nanovllm.backends.sampler import FastSampler
from nanovllm.backends.staging import InputStaging
from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.executor.step_inputs import StepInputs
from nanovllm.models.attention import AttentionMetadata


class CudaModelRunner(ModelRunner):
    sampler_class = FastSampler  # (the same tokens, sooner: `backends/sampler.py`)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.input_batch = InputBatch(self.block_size)
        self.staging = InputStaging(self.device)
        # Decode steps replayed from CUDA graphs (`capture_decode_graphs`); None: all eager.
        self.graphs: DecodeGraphs | None = None
        # Events around the last forward pass: its time is read from them once the GPU has
        # passed the second.
        self._forward_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        return self.input_batch.prepare(out)

    def inputs_on_device(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_rows: list[int] | torch.Tensor,
    ) -> StepInputs:
        """Whatever is still on the host goes over in one copy, the logits rows as a tensor
        too; when everything is there already (a second call in the same step), the inputs
        are returned as they are."""
        named = {"input_ids": input_ids, "positions": positions, **meta.tensors()}
        if len(logits_rows):  # (no rows, as in the draft's pass: nothing to send)
            named["logits_rows"] = torch.as_tensor(logits_rows, dtype=torch.int64)
        on_host = [name for name, t in named.items() if t.device != self.device]
        if not on_host:
            return input_ids, positions, meta, logits_rows
        named.update(zip(on_host, self.staging.to_device([named[n] for n in on_host])))
        input_ids, positions = named.pop("input_ids"), named.pop("positions")
        logits_rows = named.pop("logits_rows", logits_rows)
        return input_ids, positions, dataclasses.replace(meta, **named), logits_rows

    def run_model(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(input_ids.numel(), meta):
            # The step's tensors are copied into the graphs' static buffers, and replayed.
            return self.graphs.run(input_ids, positions, meta)
        return super().run_model(input_ids, positions, meta)

    def forward_logits(self, input_ids, positions, meta, logits_rows) -> torch.Tensor | None:
        if self.device.type != "cuda":
            return super().forward_logits(input_ids, positions, meta, logits_rows)
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        first.record()
        logits = super().forward_logits(input_ids, positions, meta, logits_rows)
        # No synchronize here: the kernels are queued, and the host goes on (to sampling,
        # whose copy of the tokens to the host is what waits for them).
        last.record()
        self._forward_events = first, last
        return logits

    def forward_logits_time(self) -> float:
        """The GPU's time between the two events recorded around the last `forward_logits`
        (input copies, forward pass, LM head), waiting for the GPU to pass the second."""
        if self._forward_events is not None:
            first, last = self._forward_events
            last.synchronize()
            self.last_forward_logits_time = first.elapsed_time(last) / 1000
            self._forward_events = None
        return self.last_forward_logits_time

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        result = super().execute(out)
        # The host only queued the forward pass; the sampler's first read waited for it.
        # Count the forward's GPU time (now known, the GPU is past it) as forward time.
        total = self.last_forward_time + self.last_sample_time
        self.last_forward_time = min(max(self.last_forward_time, self.forward_logits_time()), total)
        self.last_sample_time = total - self.last_forward_time
        return result

    # --- set-up: graphs and the memory budget -------------------------------------------------

    def capture_decode_graphs(
        self, max_num_seqs: int, max_blocks_per_seq: int, capture: Capture = capture_cuda_graph
    ) -> float:
        """Capture the decode steps' CUDA graphs (`cuda_graphs.py`) over the KV cache allocated
        now; returns the seconds it took. Call again after `allocate_kv_cache`: a graph holds
        the addresses of the cache it was captured with. Only the Triton backend's attention
        can be captured (`setup.wants_cuda_graphs`): the torch backend plans its decode
        gathers from Python lists, which a graph would freeze."""
        start = time.perf_counter()
        self.graphs = None  # let the old graphs' memory go first
        with torch.inference_mode():
            self.graphs = DecodeGraphs(
                self.model, self.kv_caches, max_num_seqs, max_blocks_per_seq, capture
            )
        return time.perf_counter() - start

    def measure_kv_budget(self, config, max_model_len: int, graphs: bool = False) -> int:
        """`gpu_memory.measure_kv_budget` of this runner (a method: every rank runs it)."""
        return measure_kv_budget(self, config, max_model_len, graphs)

    def peak_memory_of_step(self, num_tokens: int, num_seqs: int) -> int:
        return peak_memory_of_step(self, num_tokens, num_seqs)

    def profile_step(self, num_tokens: int, num_seqs: int) -> SchedulerOutput:
        return profile_step(self, num_tokens, num_seqs)
