"""ModelRunner: turns the scheduler's decision into tensors, runs the model, samples.

Each step, for the requests the scheduler chose, the ModelRunner:

1. builds the step's flat inputs (`step_inputs.py`): token ids, positions, the slot mapping, the
   block tables and the rows whose logits are sampled;
2. runs the forward pass over the flat batch, with paged attention against the KV cache it owns
   (one key and one value tensor per layer, shaped [num_blocks, block_size, num_kv_heads,
   head_dim]);
3. computes logits only for the rows that produce a token (and prompt logprobs' rows);
4. samples one token per such request (1 to k + 1 when it verifies k proposals).

This is the plain runner, the one a learner reads. A backend (`nanovllm/backends/`) may give a
subclass that builds the same inputs from state kept between steps, sends them to a GPU in one
copy, or replays decode steps from CUDA graphs; each is tested against this one. Tensor
parallelism runs the same `forward_logits` on every rank (`tensor_parallel.py`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from nanovllm.core.kv_cache_interface import KVCacheConfig, single_group_config
from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.kv_cache_groups import with_layer_groups
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.executor.prompt_logprobs import split_prompt_logprobs, with_prompt_rows
from nanovllm.executor.random_draw import draw_for
from nanovllm.executor.sampler import Sampler
from nanovllm.executor.step_inputs import StepInputs, step_inputs
from nanovllm.models.attention import AttentionMetadata
from nanovllm.models.llama import CausalLM


class ModelRunner:
    """One rank's runner: its model (or its shard of it) and its KV cache (or its heads' share)."""

    sampler_class: Callable[..., Sampler] = Sampler  # (a fast runner gives a fast sampler)

    def __init__(
        self,
        model: CausalLM,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        sampler: Callable[..., Sampler] | None = None,  # (`engine/parts.py`: a lesson's own)
        step_inputs: Callable[[SchedulerOutput, int], StepInputs] = step_inputs,
    ) -> None:
        self.model, self.block_size, self.dtype, self.device = model, block_size, dtype, device
        self.step_inputs = step_inputs
        self.sampler = (sampler or self.sampler_class)(draw=draw_for(device))  # vLLM's draw here
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.layer_to_kv_cache_group: tuple[int, ...] = ()  # each layer's group (one: empty)
        self.last_inputs: StepInputs | None = None  # the last step's (`step_events.py` reads them)
        self.last_prepare_time = 0.0  # seconds of the last step's parts (`engine/stats.py`)
        self.last_forward_time = 0.0  # inputs, forward pass and LM head
        self.last_sample_time = 0.0
        self.last_forward_logits_time = 0.0  # `forward_logits` alone

    @property
    def num_kv_heads(self) -> int:
        """The KV heads this rank holds (all of them without tensor parallelism)."""
        return self.model.model.layers[0].self_attn.num_kv_heads

    def allocate_kv_cache(self, num_blocks: int, kv_cache_config: KVCacheConfig | None = None):
        """The paged KV cache: per layer, a key and a value tensor of `num_blocks` blocks; with
        KV cache groups (`kv_cache_interface.py`), the j-th layer of every group shares pair j."""
        args = self.model.args
        n = args.num_hidden_layers
        config = kv_cache_config or single_group_config(n, self.block_size)
        shape = (num_blocks, self.block_size, self.num_kv_heads, args.head_dim)
        self.kv_caches = []  # let an earlier (profiling) cache go before the new one is made
        pairs = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(config.num_kv_tensors)
        ]
        self.kv_caches = [pairs[j] for j in config.layer_to_kv_tensor(n)]
        self.layer_to_kv_cache_group = config.layer_to_group(n) if config.num_groups > 1 else ()

    def prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        """The step's flat tensors, on the host: input_ids, positions, metadata, logits rows.
        (With tensor parallelism they travel from here to every rank.)"""
        return self.step_inputs(out, self.block_size)

    def inputs_on_device(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_rows: list[int] | torch.Tensor,
    ) -> StepInputs:
        """The step's tensors on this runner's device (on a CPU: as they are)."""
        if self.device.type == "cpu":
            return input_ids, positions, meta, logits_rows
        moved = {name: t.to(self.device) for name, t in meta.tensors().items()}
        meta = dataclasses.replace(meta, **moved)
        return input_ids.to(self.device), positions.to(self.device), meta, logits_rows

    def run_model(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        meta = with_layer_groups(meta, self.layer_to_kv_cache_group)  # (a hybrid model's)
        return self.model(input_ids, positions, self.kv_caches, meta)

    @torch.inference_mode()
    def forward_logits(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
        logits_rows: list[int] | torch.Tensor,
    ) -> torch.Tensor | None:
        """This rank's forward pass over the step; the logits of `logits_rows` ([rows, vocab]),
        or None when no row samples. Under tensor parallelism every rank runs it at once."""
        start = time.perf_counter()
        input_ids, positions, meta, logits_rows = self.inputs_on_device(
            input_ids, positions, meta, logits_rows
        )
        hidden = self.run_model(input_ids, positions, meta)  # [num_tokens, hidden_size]
        logits = self.model.compute_logits(hidden[logits_rows]) if len(logits_rows) else None
        self.last_forward_logits_time = time.perf_counter() - start
        return logits  # [num_rows, vocab_size]

    def forward_logits_time(self) -> float:
        """Seconds this runner's last `forward_logits` took (the step summary has every
        rank's, `snapshot.py`)."""
        return self.last_forward_logits_time

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: build the inputs (kept as `last_inputs`), forward pass, sample."""
        start = time.perf_counter()
        inputs = self.last_inputs = with_prompt_rows(self.prepare_inputs(out), out)  # (+ prompts')
        self.last_prepare_time = time.perf_counter() - start
        logits = self.forward_logits(*inputs)
        self.last_forward_time = time.perf_counter() - start
        return self.sample(out, logits)

    def sample(self, out: SchedulerOutput, logits: torch.Tensor | None) -> ModelRunnerOutput:
        """One token (1 to k + 1 when verifying proposals) for each request that samples."""
        start = time.perf_counter()
        result = ModelRunnerOutput()
        logits, result.prompt_logprobs = split_prompt_logprobs(logits, out)
        sampling = [s for s in out.scheduled if s.samples]
        if sampling:
            logits = out.logits_mask.apply(logits)  # (structured outputs)
            sampled = self.sampler(
                logits, [s.request for s in sampling], [s.to_verify for s in sampling]
            )
            result.add_sampled([s.request.request_id for s in sampling], sampled)
        self.last_sample_time = time.perf_counter() - start
        return result
