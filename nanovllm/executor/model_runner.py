"""ModelRunner: turns the scheduler's decision into tensors, runs the model, samples.

Each step the scheduler says "request A: compute 512 tokens starting at 0; request B: 1 token
starting at 37; ...". The ModelRunner:

1. builds the step's inputs with no padding: one flat list of token ids for all requests, their
   positions, the cache slot each new token's K/V goes to (`slot_mapping`), the block tables,
   context lengths and where each request's queries start. `step_inputs` below builds them
   from scratch, the plain way; the runner uses `InputBatch` (input_batch.py), which keeps the
   block tables from step to step and gives the same tensors faster. They are built on the
   host; on a GPU they go over together, in one copy (`inputs_on_device`, staging.py);
2. runs the forward pass over the flat batch, with paged attention against the KV cache it owns
   (one key and one value tensor per layer, shaped [num_blocks, block_size, num_kv_heads,
   head_dim]);
3. computes logits only for the rows that produce a token: the last scheduled token of each
   request that has caught up (and, with speculative decoding, the rows of its proposed tokens:
   each one's logits verify the next proposal). A prefill chunk that does not reach the end of
   its prompt, and every prompt token but the last, need no logits (for a 4k vocabulary and a
   2k-token prefill that is most of the LM head's work saved);
4. samples one token per such request (1 to k + 1 when it verifies k proposals).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.attention import AttentionMetadata, decode_groups
from nanovllm.executor.cuda_graphs import Capture, DecodeGraphs, capture_cuda_graph
from nanovllm.executor.input_batch import InputBatch
from nanovllm.executor.memory import kv_cache_budget
from nanovllm.executor.sampler import Sampler
from nanovllm.executor.staging import InputStaging
from nanovllm.models.llama import CausalLM


@dataclass
class ModelRunnerOutput:
    """One step's results, by request id."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)  # 1 to k + 1 each
    logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)  # one per token
    errors: dict[str, str] = field(default_factory=dict)  # requests that could not be sampled


class ModelRunner:
    """One rank's runner: its model (or its shard of it) and its KV cache (or its heads' share).

    With tensor parallelism (`group`, on rank 0 only) the step's inputs are prepared here, once;
    `forward_logits` then runs on every rank at the same time (`WorkerGroup.run`), whose layers
    meet in their all-reduces; and the tokens are sampled here, on rank 0 alone.
    """

    def __init__(
        self, model: CausalLM, block_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.sampler = Sampler()
        # The step's inputs come from a persistent batch; None builds them with `step_inputs`,
        # the plain reference it is tested against (tests/test_input_batch.py).
        self.input_batch: InputBatch | None = InputBatch(block_size)
        # On a GPU, the step's inputs go over in one copy through a pinned buffer (staging.py).
        self.staging = InputStaging(device)
        self.group = None  # rank 0's WorkerGroup with tensor parallelism
        # Speculative decoding with a draft model (rank 0 only): the draft's runner, whose KV
        # cache has the same blocks as this one. Every step it runs over the same tokens at the
        # same slots, so its cache holds the draft's KV wherever this one holds the target's:
        # prefix-cache hits, preemption and rejected proposals need nothing more.
        self.draft: ModelRunner | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        # Decode steps replayed from CUDA graphs (`capture_decode_graphs`); None: all eager.
        self.graphs: DecodeGraphs | None = None
        self.last_forward_time = 0.0
        self.last_sample_time = 0.0
        self.last_rank_forward_time = 0.0
        # On a GPU, events around the last forward pass: its time is read from them once the
        # GPU has passed the second (no synchronize just to time it).
        self._forward_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    @property
    def num_kv_heads(self) -> int:
        """The KV heads this rank holds (all of them without tensor parallelism)."""
        return self.model.model.layers[0].self_attn.num_kv_heads

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """The paged KV cache: per layer, a key and a value tensor of `num_blocks` blocks."""
        args = self.model.args
        shape = (num_blocks, self.block_size, self.num_kv_heads, args.head_dim)
        self.kv_caches = []  # let an earlier (profiling) cache go before the new one is made
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(args.num_hidden_layers)
        ]

    def capture_decode_graphs(
        self, max_num_seqs: int, max_blocks_per_seq: int, capture: Capture = capture_cuda_graph
    ) -> float:
        """Capture the decode steps' CUDA graphs (`cuda_graphs.py`) over the KV cache allocated
        now; returns the seconds it took. Call again after `allocate_kv_cache`: a graph holds
        the addresses of the cache it was captured with."""
        backend = self.model.model.layers[0].self_attn.attn.name
        if backend != "triton":  # (the others plan from Python lists a graph would freeze)
            raise ValueError(f"CUDA graphs need the 'triton' attention backend, not {backend!r}")
        start = time.perf_counter()
        self.graphs = None  # let the old graphs' memory go first
        with torch.inference_mode():
            self.graphs = DecodeGraphs(
                self.model, self.kv_caches, max_num_seqs, max_blocks_per_seq, capture
            )
        return time.perf_counter() - start

    def profile_step(self, num_tokens: int, num_seqs: int) -> SchedulerOutput:
        """The largest step the scheduler can make, for measuring its memory (`memory.py`).

        `num_tokens` prompt tokens split over `num_seqs` fresh requests, every one sampling (so
        the LM head sees its largest batch too), in a temporary KV cache just big enough for
        them, allocated here in place of the runner's.
        """
        from nanovllm.core.scheduler import ScheduledRequest
        from nanovllm.request import Request
        from nanovllm.sampling_params import SamplingParams

        num_seqs = max(min(num_seqs, num_tokens), 1)
        lengths = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
        blocks_per_seq = [-(-n // self.block_size) for n in lengths]
        self.allocate_kv_cache(sum(blocks_per_seq))
        out = SchedulerOutput(step=0)
        first_block = 0
        for i, (n, num_blocks) in enumerate(zip(lengths, blocks_per_seq)):
            request = Request(f"profile-{i}", [0] * n, SamplingParams(temperature=0), 0)
            block_table = tuple(range(first_block, first_block + num_blocks))
            first_block += num_blocks
            out.scheduled.append(ScheduledRequest(request, n, 0, block_table, True, True))
        return out

    def measure_kv_budget(self, config, max_model_len: int, graphs: bool = False) -> int:
        """Bytes this rank can give its KV cache (`executor/memory.py`); `graphs`: less the
        memory pool of the CUDA graphs that will be captured."""
        return kv_cache_budget(self, config, max_model_len, graphs)

    @staticmethod
    def kv_bytes_per_block(
        model_args, block_size: int, dtype: torch.dtype, tensor_parallel_size: int = 1
    ) -> int:
        """Bytes of one KV block on one rank (which holds num_kv_heads / tp heads, at least 1)."""
        kv_heads = max(model_args.num_key_value_heads // tensor_parallel_size, 1)
        per_token = 2 * model_args.num_hidden_layers * kv_heads * model_args.head_dim
        return per_token * block_size * torch.empty((), dtype=dtype).element_size()

    def prepare_inputs(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """The step's flat tensors. Returns input_ids, positions, metadata and logits rows."""
        # Built on the CPU: with tensor parallelism they travel to every rank from here.
        if self.input_batch is not None:
            return self.input_batch.prepare(out)
        return step_inputs(out, self.block_size)

    @torch.inference_mode()
    def forward_logits(
        self,
        input_ids: torch.Tensor,  # [num_tokens], on the CPU or already on this device
        positions: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
        logits_rows: list[int] | torch.Tensor,  # (a tensor: on this device already)
    ) -> torch.Tensor | None:
        """This rank's forward pass over the step; the logits of `logits_rows` ([rows, vocab]),
        or None when no row samples. Every rank runs it together under tensor parallelism."""
        start = time.perf_counter()
        device = self.device
        events = None
        if device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        input_ids, positions, meta, logits_rows = self.inputs_on_device(
            input_ids, positions, meta, logits_rows
        )
        if self.graphs is not None and self.graphs.can_run(input_ids.numel(), meta):
            # The step's tensors are copied into the graphs' static buffers, and replayed.
            hidden = self.graphs.run(input_ids, positions, meta)  # [num_tokens, hidden]
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [num_tokens, hidden]
        logits = self.model.compute_logits(hidden[logits_rows]) if len(logits_rows) else None
        if events is not None:
            # No synchronize here: the kernels are queued, and the host goes on (to sampling,
            # whose copy of the tokens to the host is what waits for them).
            events[1].record()
        self._forward_events = events
        self.last_rank_forward_time = time.perf_counter() - start
        return logits  # [num_rows, vocab]

    def inputs_on_device(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_rows: list[int] | torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int] | torch.Tensor]:
        """The step's inputs on this runner's device: on a GPU, whatever is still on the host
        goes over in one copy (`staging.py`), the logits rows as a tensor too; on a CPU, or when
        everything is there already (a second call in the same step), they are returned as they
        are."""
        if self.device.type == "cpu":
            return input_ids, positions, meta, logits_rows
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

    def rank_forward_time(self) -> float:
        """Seconds this rank's last `forward_logits` took (per rank, for the step summary). On a
        GPU: the GPU's time between the two events recorded around it (input copies, forward
        pass, LM head), waiting for the GPU to pass the second if it has not yet."""
        if self._forward_events is not None:
            first, last = self._forward_events
            last.synchronize()
            self.last_rank_forward_time = first.elapsed_time(last) / 1000
            self._forward_events = None
        return self.last_rank_forward_time

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: forward pass (on every rank), then sample (here)."""
        start = time.perf_counter()
        inputs = self.prepare_inputs(out)
        if self.group is not None:
            logits = self.group.run("forward_logits", *inputs)
        else:
            if self.draft is not None:  # to the device once, for the model and its draft alike
                inputs = self.inputs_on_device(*inputs)
            logits = self.forward_logits(*inputs)
        if self.draft is not None:
            self.draft.forward_logits(*inputs[:3], [])  # the draft's KV of the same tokens
        sampling = [s for s in out.scheduled if s.samples]
        if not sampling:
            self.last_forward_time = time.perf_counter() - start
            self.last_sample_time = 0.0
            return ModelRunnerOutput()
        mid = time.perf_counter()
        sampled = self.sampler(
            logits, [s.request for s in sampling], [s.spec_token_ids for s in sampling]
        )
        end = time.perf_counter()
        self.last_forward_time = mid - start
        if self.device.type == "cuda" and self.group is None:
            # The host only queued the forward pass; the sampler's first read waited for it.
            # Count the forward's GPU time (now known, the GPU is past it) as forward time.
            self.last_forward_time = min(max(mid - start, self.rank_forward_time()), end - start)
        self.last_sample_time = end - start - self.last_forward_time
        result = ModelRunnerOutput()
        for i, s in enumerate(sampling):
            rid = s.request.request_id
            if i in sampled.errors:
                result.errors[rid] = sampled.errors[i]
                continue
            result.sampled_token_ids[rid] = sampled.token_ids[i]
            if sampled.logprobs[i] is not None:
                result.logprobs[rid] = sampled.logprobs[i]
        return result


def step_inputs(
    out: SchedulerOutput, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
    """The step's flat tensors, built from scratch: input_ids, positions, attention metadata and
    the rows whose logits are sampled (the last own token of each sampling request, then its
    proposals)."""
    input_ids: list[int] = []
    positions: list[int] = []
    seq_lens: list[int] = []
    query_lens: list[int] = []
    logits_rows: list[int] = []
    for s in out.scheduled:
        start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
        num_spec = len(s.spec_token_ids)  # proposed tokens come after the request's own
        input_ids.extend(s.request.all_token_ids[start : end - num_spec])
        input_ids.extend(s.spec_token_ids)
        positions.extend(range(start, end))
        seq_lens.append(end)
        query_lens.append(s.num_new_tokens)
        if s.samples:  # the request's last own token, then each proposal
            logits_rows.extend(range(len(input_ids) - 1 - num_spec, len(input_ids)))

    block_tables = [s.block_table for s in out.scheduled]
    positions_t, meta = step_metadata(positions, query_lens, seq_lens, block_tables, block_size)
    input_ids_t = torch.tensor(input_ids, dtype=torch.int64)
    return input_ids_t, positions_t, meta, logits_rows


def step_metadata(
    positions: list[int],
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
) -> tuple[torch.Tensor, AttentionMetadata]:
    """The positions tensor and the attention metadata of a flat batch, on the CPU.

    Sequence i computes `query_lens[i]` new tokens at `positions` (flat, sequence after
    sequence) and has `seq_lens[i]` tokens of context after the step, in the blocks of
    `block_tables[i]`. (The draft model of speculative decoding builds its steps with this too.)
    """
    max_blocks = max(len(table) for table in block_tables)
    flat_tables = [
        b for table in block_tables for b in list(table) + [0] * (max_blocks - len(table))
    ]
    # [num_seqs, max_blocks], padded with block 0 (never read past seq_lens)
    block_tables_t = torch.tensor(flat_tables, dtype=torch.int32).view(len(block_tables), -1)
    positions_t = torch.tensor(positions, dtype=torch.int64)  # [num_tokens]
    # Each token's slot through its request's block table. (In plain Python: a step is mostly
    # decodes, one token each, where a few list operations cost less than tensor indexing.)
    slots: list[int] = []
    query_starts = [0]
    for table, n in zip(block_tables, query_lens):
        start = query_starts[-1]
        slots.extend(
            table[pos // block_size] * block_size + pos % block_size
            for pos in positions[start : start + n]
        )
        query_starts.append(start + n)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)  # [num_tokens]

    # Decodes sorted by context length, in groups (`decode_groups`): each group's gather is
    # padded only to its own longest context, not to the longest in the step.
    decode_seqs = sorted((i for i, n in enumerate(query_lens) if n == 1), key=seq_lens.__getitem__)
    meta = AttentionMetadata(
        slot_mapping=slot_mapping,
        block_tables=block_tables_t,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(query_starts, dtype=torch.int32),
        seq_lens_list=seq_lens,
        query_lens_list=query_lens,
        query_start_list=query_starts,
        decode_seq_indices=torch.tensor(decode_seqs, dtype=torch.int64),
        decode_token_indices=torch.tensor(
            [query_starts[i] for i in decode_seqs], dtype=torch.int64
        ),
        prefill_seq_indices=[i for i, n in enumerate(query_lens) if n > 1],
        decode_groups=decode_groups(decode_seqs, seq_lens),
    )
    return positions_t, meta
