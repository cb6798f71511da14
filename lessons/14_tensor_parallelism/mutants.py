"""Lesson 14 planted bugs: shards cut along the wrong dimension or in the wrong order, partial
results put together the wrong way, and attention heads dealt out wrongly."""

from __future__ import annotations

import torch

from nanovllm.lessons.testing import Mutant, variant


def _column_shard(weight, rank, world_size, *, bug=""):
    if bug == "column-shard-takes-columns":
        n = weight.shape[-1] // world_size
        return weight.narrow(-1, rank * n, n)
    if bug == "column-shard-size-from-the-input":
        n = (weight.shape[1] if weight.dim() == 2 else weight.shape[0]) // world_size
        return weight.narrow(0, rank * n, n)
    if bug == "column-shard-interleaved":
        return weight[rank::world_size]
    n = weight.shape[0] // world_size
    if bug == "column-shard-ranks-reversed":
        rank = world_size - 1 - rank
    return weight.narrow(0, rank * n, n)


def _row_shard(weight, rank, world_size, *, bug=""):
    if bug == "row-shard-takes-rows":
        n = weight.shape[0] // world_size
        return weight.narrow(0, rank * n, n)
    if bug == "row-shard-interleaved":
        return weight[:, rank::world_size]
    n = weight.shape[1] // world_size
    if bug == "row-shard-next-ranks-columns":
        rank = (rank + 1) % world_size
    return weight.narrow(1, rank * n, n)


def _gather_columns(outputs, *, bug=""):
    if bug == "gather-sums":
        return sum(outputs[1:], outputs[0])
    if bug == "gather-along-the-tokens":
        return torch.cat(outputs, dim=0)
    if bug == "gather-reversed":
        return torch.cat(outputs[::-1], dim=-1)
    if bug == "gather-interleaves-features":
        return torch.stack(outputs, dim=-1).flatten(-2)
    return torch.cat(outputs, dim=-1)


def _reduce_rows(partials, bias, *, bug=""):
    if bug == "reduce-concatenates":
        total = torch.cat(partials, dim=-1)
        return total if bias is None else total + bias.repeat(len(partials))
    if bug == "reduce-averages":
        total = torch.stack(partials).mean(dim=0)
    elif bug == "reduce-keeps-rank-0":
        total = partials[0]
    elif bug == "reduce-in-place":
        total = partials[0]
        for p in partials[1:]:
            total += p  # into the caller's tensor
    else:
        total = torch.stack(partials).sum(dim=0)
    if bias is None or bug == "reduce-forgets-the-bias":
        return total
    if bug == "reduce-bias-on-every-rank":
        return total + len(partials) * bias
    return total + bias


def _heads_of_rank(rank, world_size, num_heads, num_kv_heads, *, bug=""):
    n, kv = world_size, num_kv_heads
    per_rank = num_heads // n
    if bug == "query-heads-interleaved":
        q = list(range(rank, num_heads, n))
    else:
        q = list(range(rank * per_rank, (rank + 1) * per_rank))
    if bug == "kv-heads-split-like-query-heads":
        return q, list(range(rank * kv // n, (rank + 1) * kv // n))
    if bug == "every-kv-head-on-every-rank":
        return q, list(range(kv))
    if bug == "kv-head-count-from-query-heads":
        return q, list(range(rank * per_rank, (rank + 1) * per_rank))
    if n > kv:
        copies = n // kv
        return q, [rank % kv if bug == "kv-head-by-rank-modulo" else rank // copies]
    kv_per_rank = kv // n
    return q, list(range(rank * kv_per_rank, (rank + 1) * kv_per_rank))


def _bug(name: str, description: str, function: str, impl) -> Mutant:
    def build(reference):
        def broken(*args):
            return impl(*args, bug=name)

        return variant(reference, **{function: broken})

    return Mutant(name, description, build)


MUTANTS = [
    _bug(
        "column-shard-takes-columns",
        "column_shard cuts the input columns instead of the output rows",
        "column_shard",
        _column_shard,
    ),
    _bug(
        "column-shard-size-from-the-input",
        "column_shard's rows per rank are input_size / N",
        "column_shard",
        _column_shard,
    ),
    _bug(
        "column-shard-interleaved",
        "column_shard takes every N-th row from row r (r, r + N, ...)",
        "column_shard",
        _column_shard,
    ),
    _bug(
        "column-shard-ranks-reversed",
        "rank r takes the rows of rank N - 1 - r",
        "column_shard",
        _column_shard,
    ),
    _bug(
        "row-shard-takes-rows",
        "row_shard cuts the output rows instead of the input columns",
        "row_shard",
        _row_shard,
    ),
    _bug(
        "row-shard-interleaved",
        "row_shard takes every N-th column from column r",
        "row_shard",
        _row_shard,
    ),
    _bug(
        "row-shard-next-ranks-columns",
        "rank r takes the columns of rank r + 1",
        "row_shard",
        _row_shard,
    ),
    _bug("gather-sums", "gather_columns adds the outputs", "gather_columns", _gather_columns),
    _bug(
        "gather-along-the-tokens",
        "gather_columns stacks the outputs as more tokens",
        "gather_columns",
        _gather_columns,
    ),
    _bug(
        "gather-reversed",
        "gather_columns puts the ranks in reverse order",
        "gather_columns",
        _gather_columns,
    ),
    _bug(
        "gather-interleaves-features",
        "gather_columns interleaves the ranks' features (r0 f0, r1 f0, r0 f1, ...)",
        "gather_columns",
        _gather_columns,
    ),
    _bug(
        "reduce-concatenates",
        "reduce_rows concatenates the partials instead of adding them",
        "reduce_rows",
        _reduce_rows,
    ),
    _bug("reduce-averages", "reduce_rows averages the partials", "reduce_rows", _reduce_rows),
    _bug(
        "reduce-keeps-rank-0",
        "reduce_rows returns rank 0's partial (plus the bias)",
        "reduce_rows",
        _reduce_rows,
    ),
    _bug(
        "reduce-in-place",
        "reduce_rows sums into rank 0's partial, the caller's tensor",
        "reduce_rows",
        _reduce_rows,
    ),
    _bug(
        "reduce-forgets-the-bias",
        "reduce_rows never adds the bias",
        "reduce_rows",
        _reduce_rows,
    ),
    _bug(
        "reduce-bias-on-every-rank",
        "reduce_rows adds the bias once per rank",
        "reduce_rows",
        _reduce_rows,
    ),
    _bug(
        "query-heads-interleaved",
        "rank r runs query heads r, r + N, ...",
        "heads_of_rank",
        _heads_of_rank,
    ),
    _bug(
        "kv-heads-split-like-query-heads",
        "KV heads split num_kv_heads / N per rank even when that is less than one",
        "heads_of_rank",
        _heads_of_rank,
    ),
    _bug(
        "every-kv-head-on-every-rank",
        "every rank holds every KV head (N times the KV cache, and the wrong ones)",
        "heads_of_rank",
        _heads_of_rank,
    ),
    _bug(
        "kv-head-count-from-query-heads",
        "a rank's KV heads are numbered like its query heads",
        "heads_of_rank",
        _heads_of_rank,
    ),
    _bug(
        "kv-head-by-rank-modulo",
        "with more ranks than KV heads, rank r holds KV head r % num_kv_heads",
        "heads_of_rank",
        _heads_of_rank,
    ),
]
