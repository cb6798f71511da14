"""Lesson 04 properties: gathering through a block table, and decode attention over it.

Every case scatters a sequence over random physical blocks of a pool whose other slots hold large
stale values, as a real cache holds earlier owners' K/V: one read past the sequence's end
dominates the softmax and shows.
"""

from __future__ import annotations

import torch
from hypothesis import given

from nanovllm.lessons.strategies import (
    PagedCase,
    causal_attention_oracle,
    paged_sequence,
    scattered_table,
    seeds,
)
from nanovllm.lessons.testing import lesson_settings, show_inputs


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return actual.shape == expected.shape and torch.allclose(
        actual.double(), expected.double(), atol=1e-5, rtol=1e-4
    )


def _decode(impl, case: PagedCase) -> torch.Tensor:
    """paged_decode on fresh copies of the case's tensors; every argument is checked unchanged
    after the call (a reader only reads)."""
    query, (key_cache, value_cache), table = (
        case.query.clone(),
        case.caches(),
        list(case.block_table),
    )
    given = query.clone(), key_cache.clone(), value_cache.clone(), list(table)
    out = impl.paged_decode(query, key_cache, value_cache, table, case.seq_len, case.scale)
    for name, now, was in zip(
        ("query", "key_cache", "value_cache"), (query, key_cache, value_cache), given
    ):
        assert torch.equal(now, was), (
            f"paged_decode changed the caller's {name} in place (mul_, +=, a write through a "
            "view): attention only reads its inputs"
        )
    assert table == given[3], f"paged_decode changed the caller's block_table to {table}"
    return out


@lesson_settings(40)
@given(case=paged_sequence())
@show_inputs
def test_gather_returns_the_sequence_in_logical_order(impl, case):
    """gather_kv reads exactly positions 0..seq_len-1, in order, through the block table, and
    leaves the caches and the block table as they were."""
    key_cache, value_cache = case.caches()
    table = list(case.block_table)
    given = key_cache.clone(), value_cache.clone()
    keys, values = impl.gather_kv(key_cache, value_cache, table, case.seq_len)
    assert keys.shape == case.k.shape, (
        f"expected shape {tuple(case.k.shape)}, got {tuple(keys.shape)}"
    )
    assert torch.equal(keys, case.k), "gathered keys are not the sequence's keys, in order"
    assert torch.equal(values, case.v), "gathered values are not the sequence's values"
    assert torch.equal(key_cache, given[0]) and torch.equal(value_cache, given[1]), (
        "gather_kv changed the cache: it only reads"
    )
    assert table == list(case.block_table), f"gather_kv changed the block table to {table}"


@lesson_settings(40)
@given(case=paged_sequence())
@show_inputs
def test_decode_matches_contiguous_attention(impl, case):
    """paged_decode gives the attention of the query over the sequence laid out contiguously,
    with the scale it is given; it changes none of its arguments."""
    # The oracle's inputs are the case's own, made before and apart from the call's copies.
    expected = causal_attention_oracle(case.query[None], case.k, case.v, case.scale)[0]
    out = _decode(impl, case)
    if not _close(out, expected):
        error = (out.double() - expected).abs().max()
        usual = causal_attention_oracle(case.query[None], case.k, case.v, case.head_dim**-0.5)
        hint = ""
        if case.scaling != 1.0 and _close(out, usual[0]):
            hint = f": it matches scale = head_dim ** -0.5, not the scale given ({case.scale:.4g})"
        raise AssertionError(
            f"differs from attention over the contiguous sequence (max error {error:.3g}){hint}"
        )


@lesson_settings(25)
@given(case=paged_sequence(max_len=24), seed=seeds)
@show_inputs
def test_where_the_blocks_are_does_not_matter(impl, case, seed):
    """The same sequence in other physical blocks, among other stale values, gives the same
    output: only the block table says where the context is."""
    num_blocks = -(-case.seq_len // case.block_size)
    moved = PagedCase(
        case.block_size,
        case.seq_len,
        case.num_heads,
        case.num_kv_heads,
        case.head_dim,
        tuple(scattered_table(seed, num_blocks, num_blocks + 3)),
        num_blocks + 3,
        case.seed,  # same sequence: same k, v and query
        case.scaling,
    )
    assert _close(_decode(impl, case), _decode(impl, moved)), (
        "moving the blocks changed the attention output"
    )


@lesson_settings(15)
@given(case=paged_sequence(max_len=12))
@show_inputs
def test_inputs_are_not_modified(impl, case):
    """paged_decode only reads the cache: the key and value caches are unchanged afterwards."""
    key_cache, value_cache = case.caches()
    impl.paged_decode(
        case.query, key_cache, value_cache, list(case.block_table), case.seq_len, case.scale
    )
    expected_k, expected_v = case.caches()
    assert torch.equal(key_cache, expected_k), "attention must only read the cache"
    assert torch.equal(value_cache, expected_v), "attention must only read the cache"
