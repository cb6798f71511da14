"""Lesson 14 reference: the engine's parallel layers, one simulated rank at a time.

`nanovllm.distributed.as_tp_rank(r, N)` makes this process build layers as rank r of N would,
with no process group. So:

- `column_shard` builds the engine's `ColumnParallelLinear` as rank r and loads the full tensor
  through its `weight_loader`: what the layer keeps is the shard.
- `row_shard` does the same with `RowParallelLinear`.
- `heads_of_rank` loads "tagged" q and k weights (head h's rows filled with h, head size 1)
  through `QKVParallelLinear.weight_loader` and reads back which heads landed in rank r's shard.

The combinations are collectives in the engine (`nanovllm/distributed/communication.py`), which
need N processes; here they are the same arithmetic in one process. `gather_columns` is what
`tensor_model_parallel_all_gather` returns: every rank's tensor concatenated along the last
dimension, in rank order. `reduce_rows` is what `RowParallelLinear.forward` and
`tensor_model_parallel_all_reduce` compute together: rank 0's partial carries the bias (the
other ranks add none), and the all-reduce sums the partials.
"""

from __future__ import annotations

import torch

from nanovllm.distributed import as_tp_rank
from nanovllm.models.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear

__all__ = ["column_shard", "row_shard", "gather_columns", "reduce_rows", "heads_of_rank"]


def column_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    out_features = weight.shape[0]
    in_features = weight.shape[1] if weight.dim() == 2 else 1
    with as_tp_rank(rank, world_size):
        layer = ColumnParallelLinear(
            in_features, out_features, bias=weight.dim() == 1, params_dtype=weight.dtype
        )
    param = layer.bias if weight.dim() == 1 else layer.weight
    layer.weight_loader(param, weight)
    return param.data


def row_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    out_features, in_features = weight.shape
    with as_tp_rank(rank, world_size):
        layer = RowParallelLinear(in_features, out_features, params_dtype=weight.dtype)
    layer.weight_loader(layer.weight, weight)
    return layer.weight.data


def gather_columns(outputs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(list(outputs), dim=-1)


def reduce_rows(partials: list[torch.Tensor], bias: torch.Tensor | None) -> torch.Tensor:
    total = partials[0] if bias is None else partials[0] + bias  # rank 0 adds the bias
    for partial in partials[1:]:
        total = total + partial
    return total


def heads_of_rank(
    rank: int, world_size: int, num_heads: int, num_kv_heads: int
) -> tuple[list[int], list[int]]:
    with as_tp_rank(rank, world_size):
        layer = QKVParallelLinear(1, 1, num_heads, num_kv_heads, params_dtype=torch.float64)
    # Head size 1 and hidden size 1: row h of a projection is head h; fill it with h.
    layer.weight_loader(layer.weight, torch.arange(num_heads, dtype=torch.float64)[:, None], "q")
    kv = torch.arange(num_kv_heads, dtype=torch.float64)[:, None]
    layer.weight_loader(layer.weight, kv, "k")
    layer.weight_loader(layer.weight, kv, "v")
    rows = layer.weight[:, 0]  # [q heads; k heads; v heads]
    # Only the q and k rows are read: they are what this function returns.
    q_heads = [int(h) for h in rows[: layer.num_heads]]
    k_heads = [int(h) for h in rows[layer.num_heads : layer.num_heads + layer.num_kv_heads]]
    return q_heads, k_heads
