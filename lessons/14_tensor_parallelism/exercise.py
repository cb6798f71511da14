"""Lesson 14 exercise: cutting linear layers across N ranks, and putting their results together.

Every function here is about one rank r of N (`rank`, `world_size`), with no process group:
the properties simulate all N ranks in one process and compare with the uncut layer. A linear
layer computes y = x W^T + b with W of shape [output_size, input_size] (torch's layout, and the
checkpoint's), b of shape [output_size].

Check with `nanovllm lesson 14 --check`.
"""

from __future__ import annotations

import torch


def column_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s part of a column-parallel layer's weight or bias.

    Column parallelism splits the layer's *outputs*: rank r computes output features
    [r * n, (r + 1) * n), n = output_size / world_size, so it holds those rows of W
    ([output_size, input_size] -> [n, input_size]) and those entries of b ([output_size] -> [n]).
    output_size is a multiple of world_size. Return a tensor of the shard's shape (a view or a
    copy); do not modify `weight`.
    """
    raise NotImplementedError("write column_shard (lesson 14)")


def row_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s part of a row-parallel layer's weight [output_size, input_size].

    Row parallelism splits the layer's *inputs*: rank r receives input features
    [r * n, (r + 1) * n) of x, n = input_size / world_size, and holds the matching columns of W:
    [output_size, input_size] -> [output_size, n]. (The bias is not split: see `reduce_rows`.)
    input_size is a multiple of world_size. Do not modify `weight`.
    """
    raise NotImplementedError("write row_shard (lesson 14)")


def gather_columns(outputs: list[torch.Tensor]) -> torch.Tensor:
    """The whole output of a column-parallel layer, from every rank's part (an all-gather).

    outputs[r]: rank r's output [num_tokens, n], for output features [r * n, (r + 1) * n).
    Returns [num_tokens, n * len(outputs)]: all output features in order.
    """
    raise NotImplementedError("write gather_columns (lesson 14)")


def reduce_rows(partials: list[torch.Tensor], bias: torch.Tensor | None) -> torch.Tensor:
    """The whole output of a row-parallel layer, from every rank's partial result (an all-reduce).

    partials[r]: rank r's x_r W_r^T, [num_tokens, output_size], computed from its slice of the
    input features alone, without the bias. bias: [output_size], or None. Returns
    [num_tokens, output_size]: x W^T + b. Do not modify the partials.
    """
    raise NotImplementedError("write reduce_rows (lesson 14)")


def heads_of_rank(
    rank: int, world_size: int, num_heads: int, num_kv_heads: int
) -> tuple[list[int], list[int]]:
    """Which attention heads rank `rank` holds: (its query heads, its key/value heads).

    Attention is cut by heads: rank r runs num_heads / world_size whole query heads, the next
    ones in order (rank 0 the first ones). With grouped-query attention, query head h reads
    key/value head h // (num_heads // num_kv_heads), so a rank must hold the KV heads its query
    heads read, and no others:
    - world_size <= num_kv_heads: num_kv_heads / world_size KV heads each, in order;
    - world_size > num_kv_heads: a rank cannot hold a fraction of a head, so each holds ONE KV
      head, and each KV head is copied on world_size / num_kv_heads ranks.
    Both lists in increasing order. num_heads is a multiple of world_size, and world_size and
    num_kv_heads divide one another.
    """
    raise NotImplementedError("write heads_of_rank (lesson 14)")
