"""A probe around one layer's paged attention: what it computed for one request, from its own tensors.

The executor's events (`step_events.py`) say *which* blocks a request's attention reads. The
probe shows what it computes there: for one request and one layer, the query of the request's
newest token in this step (the row at position `seq_len - 1`, which attends to the whole
context), the keys the forward pass read through the block table, and from them, block by block,
the online softmax's scores, running max and running sum, and the final weights
(`online_softmax.py`), for every query head of the layer.

It costs nothing while off: `AttentionProbe.install` swaps the layer's attention object for a
wrapper and `remove` swaps the original back, so an unprobed forward pass runs exactly the code
it always runs (no flag is read inside attention). While installed, the wrapper delegates every
call to the backend's attention (`forward`, and `attend` for the CPU backend's fused layer) and
then, in the steps where the request runs, copies one query row and gathers its keys from the
paged cache (complete by then: the step's K/V are written before attention reads them).

`ObservedExecutor` arms the probe before each step (which batch row, if the request is in the
batch) and turns what it caught into an `AttentionProbed` event after it. With tensor
parallelism the probe sees rank 0's heads (the first 1/N of them). Decode steps replayed from
CUDA graphs run no Python, and async scheduling's steps do not pass through `ObservedExecutor`:
the probe catches nothing in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.events import AttentionProbed
from nanovllm.executor.online_softmax import OnlineSoftmaxWalk, online_softmax_walk
from nanovllm.models.attention import AttentionMetadata, gather_context


@dataclass(frozen=True)
class Caught:
    """One step's catch: the request's context and its query's walk over it."""

    seq_len: int
    block_table: tuple[int, ...]  # the blocks read, ceil(seq_len / block_size) of them
    walk: OnlineSoftmaxWalk


class ProbedAttention:
    """A layer's attention object, unchanged, that also catches one request's query and keys."""

    def __init__(self, inner: Any, block_size: int) -> None:
        self.inner = inner  # the backend's attention (TorchAttention, CpuAttention, ...)
        self.block_size = block_size
        self.seq_index: int | None = None  # the request's row in the step's batch, when it runs
        self.caught: Caught | None = None

    def __getattr__(self, name: str) -> Any:  # (scale, num_heads ... : the backend's own)
        return getattr(self.inner, name)

    def forward(self, q, k, v, key_cache, value_cache, meta: AttentionMetadata) -> torch.Tensor:
        out = self.inner.forward(q, k, v, key_cache, value_cache, meta)
        self._catch(q, key_cache, value_cache, meta)
        return out

    def attend(self, q, key_cache, value_cache, meta: AttentionMetadata) -> torch.Tensor:
        out = self.inner.attend(q, key_cache, value_cache, meta)
        self._catch(q, key_cache, value_cache, meta)
        return out

    def _catch(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        i = self.seq_index
        if i is None:
            return
        self.seq_index = None  # once a step (a layer runs once per forward pass)
        row = meta.query_start_list[i] + meta.query_lens_list[i] - 1  # its newest token
        seq_len = meta.seq_lens_list[i]
        num_blocks = -(-seq_len // self.block_size)
        block_table = meta.block_tables[i, :num_blocks]
        keys, _ = gather_context(key_cache, value_cache, block_table, seq_len)
        walk = online_softmax_walk(q[row], keys, self.block_size, self.inner.scale)
        self.caught = Caught(seq_len, tuple(block_table.tolist()), walk)


class AttentionProbe:
    """Watches `request_id` in layer `layer` of a runner's model while installed."""

    def __init__(self, model: Any, block_size: int, request_id: str, layer: int) -> None:
        layers = model.model.layers
        if not 0 <= layer < len(layers):
            raise ValueError(f"layer {layer} out of range: the model has {len(layers)} layers")
        self.self_attn = layers[layer].self_attn
        self.request_id, self.layer = request_id, layer
        self.original = self.self_attn.attn
        self.wrapper = ProbedAttention(self.original, block_size)

    def install(self) -> None:
        self.self_attn.attn = self.wrapper

    def remove(self) -> None:
        self.self_attn.attn = self.original

    def arm(self, sched: SchedulerOutput) -> None:
        """Before a step: catch the request's row if it is in the batch (batch order is the
        scheduler's order), else nothing."""
        ids = [s.request.request_id for s in sched.scheduled]
        self.wrapper.caught = None
        self.wrapper.seq_index = ids.index(self.request_id) if self.request_id in ids else None

    def event(self, step: int) -> AttentionProbed | None:
        """After the step: what was caught, as an event (None: the request did not run, or the
        step ran no Python attention)."""
        caught, self.wrapper.caught = self.wrapper.caught, None
        self.wrapper.seq_index = None
        if caught is None:
            return None
        walk = caught.walk
        return AttentionProbed(
            step=step,
            request_id=self.request_id,
            layer=self.layer,
            block_size=self.wrapper.block_size,
            seq_len=caught.seq_len,
            block_table=caught.block_table,
            scale=float(self.original.scale),
            num_kv_heads=self.self_attn.num_kv_heads,
            scores=_rows(walk.scores),
            running_max=_rows(walk.running_max),
            running_sum=_rows(walk.running_sum),
            weights=_rows(walk.weights),
        )


def _rows(t: torch.Tensor) -> tuple[tuple[float, ...], ...]:
    """A [heads, n] tensor as one tuple of floats per head."""
    return tuple(tuple(row) for row in t.tolist())
