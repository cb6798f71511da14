"""Lesson 04 planted bugs: reading the wrong slots, or the wrong KV head."""

from __future__ import annotations

import torch

from nanovllm.lessons.testing import Mutant, variant


def _gather(key_cache, value_cache, block_table, seq_len, *, extra=0, table=None):
    """Plain gather; `extra` reads that many positions past the end; `table` overrides the
    block table (to ignore it)."""
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    table = block_table if table is None else table
    n = -(-(seq_len + extra) // block_size)
    blocks = torch.tensor(table[:n], dtype=torch.long)
    keys = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: seq_len + extra]
    values = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: seq_len + extra]
    return keys, values


def _decode(
    query,
    key_cache,
    value_cache,
    block_table,
    seq_len,
    scale,
    *,
    gather=_gather,
    kv_head=lambda h, group, num_kv_heads: h // group,
):
    keys, values = gather(key_cache, value_cache, block_table, seq_len)
    num_heads, num_kv_heads = query.shape[0], key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    for h in range(num_heads):
        kh = kv_head(h, group, num_kv_heads)
        weights = torch.softmax(keys[:, kh].float() @ query[h].float() * scale, dim=0)
        out[h] = (weights @ values[:, kh].float()).to(query.dtype)
    return out


def _whole_blocks(kc, vc, table, seq_len):
    """Reads every slot of the sequence's blocks, the unfilled end of the last one included."""
    block_size = kc.shape[1]
    return _gather(kc, vc, table, -(-seq_len // block_size) * block_size)


def _one_short(kc, vc, table, seq_len):
    return _gather(kc, vc, table, seq_len - 1) if seq_len > 1 else _gather(kc, vc, table, 1)


def _with_gather(reference, gather):
    return variant(
        reference,
        gather_kv=gather,
        paged_decode=lambda *args: _decode(*args, gather=gather),
    )


# --- Learner mistakes: wrong solutions written as a learner writes them (issue #52), kept so that
# the properties go on catching them.


def _head_dim_scale(query, key_cache, value_cache, block_table, seq_len, scale):
    """Ignores `scale`: always head_dim ** -0.5, the value the engine usually passes."""
    head_dim = query.shape[-1]
    return _decode(query, key_cache, value_cache, block_table, seq_len, head_dim**-0.5)


def _scales_query_in_place(query, key_cache, value_cache, block_table, seq_len, scale):
    """The right output, but the caller's query is scaled in place first."""
    query *= scale
    return _decode(query, key_cache, value_cache, block_table, seq_len, 1.0)


MUTANTS = [
    Mutant(
        "reads-whole-last-block",
        "gathers every slot of the last block, stale ones included",
        lambda ref: _with_gather(ref, _whole_blocks),
    ),
    Mutant(
        "one-position-short",
        "gathers seq_len - 1 positions: the new token misses itself",
        lambda ref: _with_gather(ref, _one_short),
    ),
    Mutant(
        "ignores-block-table",
        "gathers physical blocks 0, 1, 2, ... as if the cache were contiguous",
        lambda ref: _with_gather(
            ref, lambda kc, vc, t, n: _gather(kc, vc, t, n, table=list(range(len(t))))
        ),
    ),
    Mutant(
        "contiguous-from-the-first-block",
        "reads on from the first block's start, as if the later blocks followed it: right while "
        "the sequence fits one block",
        lambda ref: _with_gather(
            ref,
            lambda kc, vc, t, n: _gather(
                kc, vc, t, n, table=[(t[0] + i) % kc.shape[0] for i in range(len(t))]
            ),
        ),
    ),
    Mutant(
        "blocks-reversed",
        "walks the block table backwards",
        lambda ref: _with_gather(
            ref,
            lambda kc, vc, t, n: _gather(
                kc, vc, t, n, table=list(reversed(t[: -(-n // kc.shape[1])]))
            ),
        ),
    ),
    Mutant(
        "gqa-modulo",
        "query head h reads KV head h % num_kv_heads instead of h // group",
        lambda ref: variant(
            ref, paged_decode=lambda *a: _decode(*a, kv_head=lambda h, g, n: h % n)
        ),
    ),
    Mutant(
        "no-scale",
        "scores are not scaled by 1/sqrt(head_dim)",
        lambda ref: variant(
            ref, paged_decode=lambda q, kc, vc, t, n, scale: _decode(q, kc, vc, t, n, 1.0)
        ),
    ),
    Mutant(
        "writes-the-cache",
        "paged_decode zeroes the slots it has read (an in-place operation on a view)",
        lambda ref: variant(
            ref,
            paged_decode=lambda q, kc, vc, t, n, s: (lambda out: (kc[t[0]].zero_(), out)[1])(
                ref.paged_decode(q, kc, vc, t, n, s)
            ),
        ),
    ),
    Mutant(
        "learner-ignores-scale",
        "paged_decode uses head_dim ** -0.5 instead of the scale it is given",
        lambda ref: variant(ref, paged_decode=_head_dim_scale),
    ),
    Mutant(
        "learner-scales-query-in-place",
        "paged_decode scales the caller's query in place (query *= scale): right output",
        lambda ref: variant(ref, paged_decode=_scales_query_in_place),
    ),
]
