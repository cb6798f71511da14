"""Decode steps replayed from CUDA graphs (`enforce_eager=False` on a GPU, Triton backend).

Why. In a decode step each layer is a dozen kernels (norms, projections, RoPE, the KV write,
attention, the MLP), each launched from Python, and with one token per request each has little
work: a GPU can finish one before the host has launched the next, and then waits for the host.
A CUDA graph records every launch of one forward pass once; `replay()` issues them all again
with one call. (That is why vLLM and nano-vllm capture decode steps; what it saves here is
for `.ci/gpu` to measure, nanovllm/bench/README.md.)

The price: a graph replays exactly what it recorded, the same kernels on the same shapes at the
same memory addresses. So here:
- The inputs live in static buffers, allocated once (`input_ids`, `positions`, `slot_mapping`,
  `block_tables`, `seq_lens`, `query_start_loc`). A step copies its inputs into them, replays,
  and reads the hidden states from a static output buffer.
- One graph per batch size in `batch_sizes` (1, 2, 4, 8, then multiples of 16, as nano-vllm
  does, and `max_num_seqs`). A step of n decodes replays the smallest graph of at least n
  rows. The rows past n are padding: slot -1 (the KV write skips it, so padding never writes
  the cache), a context of one token read through whatever its block-table row holds (real
  block ids or 0: no read outside the cache), and a hidden state that is dropped. Every layer
  treats rows independently (attention within a row's own context), so padding cannot change
  a real row.
- The block tables have a fixed width, the most blocks a request can hold (`max_blocks_per_seq`).
- Only pure decode steps replay (every request one new token, no proposals to verify): steps
  with prefills change shape from step to step.
- Only with the Triton backend: the torch backend plans its decode gathers from Python lists of
  the step's context lengths, which a graph would freeze at their values during capture.

The graphs share one memory pool, captured largest first (as vLLM and nano-vllm do), so the
smaller ones reuse the largest one's intermediate buffers.

`capture` is a parameter: `capture_cuda_graph` records a real graph; `capture_eagerly` (for
tests on a CPU) "replays" by running the same function again on the same static buffers. That
checks everything here except the recording itself: the buffers, the padding, the choice of
graph. The recording is checked against eager steps by the gpu-marked tests
(tests/gpu/test_gpu_cuda_graphs.py).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable

import torch

from nanovllm.models.attention import AttentionMetadata

# capture(fn, pool) -> (replay, pool): record `fn` (which reads and writes only static
# buffers), give a function that does it again, and the memory pool for the next capture.
Capture = Callable[[Callable[[], None], object], tuple[Callable[[], None], object]]


def capture_cuda_graph(fn: Callable[[], None], pool: object) -> tuple[Callable[[], None], object]:
    """Record `fn`'s kernel launches into a CUDA graph that shares `pool` with the others."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph.replay, graph.pool()


def capture_eagerly(fn: Callable[[], None], pool: object) -> tuple[Callable[[], None], object]:
    """No graph: "replaying" runs `fn` again (tests of the buffers and padding on a CPU)."""
    return fn, pool


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, below max_num_seqs; then max_num_seqs itself."""
    sizes = [1, 2, 4, 8] + list(range(16, max_num_seqs, 16))
    return [b for b in sizes if b < max_num_seqs] + [max_num_seqs]


class DecodeGraphs:
    """The model's forward pass over decode batches, one captured graph per batch size."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        max_blocks_per_seq: int,
        capture: Capture = capture_cuda_graph,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.batch_sizes = graph_batch_sizes(max_num_seqs)
        rows = self.batch_sizes[-1]
        device = kv_caches[0][0].device
        dtype = kv_caches[0][0].dtype
        ints = dict(device=device, dtype=torch.int64)
        self.input_ids = torch.zeros(rows, **ints)  # [rows]
        self.positions = torch.zeros(rows, **ints)  # [rows]
        self.slot_mapping = torch.full((rows,), -1, **ints)  # [rows]; -1: nothing stored
        # [rows, max_blocks_per_seq]; entries past a request's table are left from earlier
        # steps: real block ids (or 0), never read past the row's context length
        self.block_tables = torch.zeros(
            (rows, max_blocks_per_seq), dtype=torch.int32, device=device
        )
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)  # [rows]
        # One query token per row: row i's token is token i.
        self.query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.hidden = torch.zeros((rows, model.args.hidden_size), dtype=dtype, device=device)
        self.num_replays = 0  # steps served by a graph (the tests count them)

        self.replays: dict[int, Callable[[], None]] = {}
        pool = None
        for batch_size in reversed(self.batch_sizes):
            forward = functools.partial(self._forward, batch_size, self._metadata(batch_size))
            # A first eager run does what must not happen during a capture: Triton compiles its
            # kernels, cuBLAS makes its handles. Every slot is -1, so the cache is not written.
            forward()
            self.replays[batch_size], pool = capture(forward, pool)

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def _metadata(self, batch_size: int) -> AttentionMetadata:
        """The attention metadata every replay of `batch_size` rows sees: views of the static
        buffers, and one query token per row (the Triton backend reads only that list)."""
        rows = torch.arange(batch_size, dtype=torch.int64, device=self.input_ids.device)
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch_size],
            block_tables=self.block_tables[:batch_size],
            seq_lens=self.seq_lens[:batch_size],
            query_start_loc=self.query_start_loc[: batch_size + 1],
            seq_lens_list=[1] * batch_size,  # not read by the Triton backend: the tensor is
            query_lens_list=[1] * batch_size,
            query_start_list=list(range(batch_size + 1)),
            decode_seq_indices=rows,
            decode_token_indices=rows,
            prefill_seq_indices=[],
        )

    def _forward(self, batch_size: int, meta: AttentionMetadata) -> None:
        hidden = self.model(
            self.input_ids[:batch_size], self.positions[:batch_size], self.kv_caches, meta
        )  # [batch_size, hidden_size]
        self.hidden[:batch_size].copy_(hidden)

    def can_run(self, num_tokens: int, meta: AttentionMetadata) -> bool:
        """A pure decode step (one token per request) that a captured graph holds."""
        return (
            num_tokens == meta.num_seqs <= self.max_batch_size
            and meta.block_tables.shape[1] <= self.block_tables.shape[1]
        )

    def run(
        self,
        input_ids: torch.Tensor,  # [n], on the CPU or the graphs' device
        positions: torch.Tensor,  # [n]
        meta: AttentionMetadata,  # n decodes
    ) -> torch.Tensor:  # [n, hidden_size], a view of the static output (valid until next run)
        """The step's hidden states, from the smallest graph of at least n rows."""
        n = meta.num_seqs
        batch_size = self.batch_sizes[bisect.bisect_left(self.batch_sizes, n)]
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        self.seq_lens[:n].copy_(meta.seq_lens)
        # Padding rows: an earlier, larger step left its requests' slots here; a replay would
        # write this step's padding K/V over them.
        self.slot_mapping[n:batch_size].fill_(-1)
        self.seq_lens[n:batch_size].fill_(1)
        self.replays[batch_size]()
        self.num_replays += 1
        return self.hidden[:n]
