"""Lesson 05 properties: the Triton kernels against plain PyTorch.

Kernels run through Triton's interpreter on a CPU: exact, but slow, so the shapes are tiny and the
examples few. head_dim is 16 (the smallest `tl.dot`-friendly size the engine's kernel accepts).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.lessons.strategies import (
    causal_attention_oracle,
    head_layouts,
    randn,
    scatter_into_pool,
    scattered_table,
    seeds,
)
from nanovllm.lessons.testing import lesson_settings, show_inputs

HEAD_DIM = 16


def _device() -> str:
    """Where the kernels want their tensors: the GPU when compiled, the CPU when interpreted."""
    from nanovllm.kernels import triton_setup

    return "cpu" if triton_setup.is_interpreted() else "cuda"


@dataclass(frozen=True)
class DecodeBatch:
    """1-3 decoding sequences scattered over one pool full of large stale values. Only the
    defining numbers are fields (a failing example prints in one line); tensors are built
    from them."""

    block_size: int
    num_heads: int
    num_kv_heads: int
    seq_lens: tuple[int, ...]
    seed: int
    # Every query element negative and every key element positive: all of a sequence's scores
    # lie far below zero (with a scale of 30, below -120), where exp(s - 0) underflows to 0.
    scores_below_zero: bool = False

    @cached_property
    def tensors(self) -> dict:
        need = [-(-n // self.block_size) for n in self.seq_lens]
        pool = sum(need) + 2
        order = scattered_table(self.seed, sum(need), pool)
        tables = [order[sum(need[:i]) : sum(need[: i + 1])] for i in range(len(need))]
        width = max(need) + 1  # padded, as the engine pads its block tables
        shape = (pool, self.block_size, self.num_kv_heads, HEAD_DIM)
        key_cache = randn(self.seed, *shape) * 100
        value_cache = randn(self.seed + 1, *shape) * 100
        ks, vs = [], []
        for i, (n, table) in enumerate(zip(self.seq_lens, tables)):
            ks.append(randn(self.seed + 10 + 2 * i, n, self.num_kv_heads, HEAD_DIM))
            if self.scores_below_zero:
                ks[-1] = ks[-1].abs() + 0.5
            vs.append(randn(self.seed + 11 + 2 * i, n, self.num_kv_heads, HEAD_DIM))
            scatter_into_pool(ks[-1], vs[-1], key_cache, value_cache, table)
        query = randn(self.seed + 2, len(self.seq_lens), self.num_heads, HEAD_DIM)
        if self.scores_below_zero:
            query = -(query.abs() + 0.5)
        return dict(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            block_tables=torch.tensor(
                [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32
            ),
            seq_lens=torch.tensor(self.seq_lens, dtype=torch.int32),
            ks=ks,
            vs=vs,
        )


@st.composite
def decode_batches(draw, max_len: int = 32, scores_below_zero: bool = False) -> DecodeBatch:
    heads = draw(head_layouts.filter(lambda hk: hk[0] <= 4), label="(num_heads, num_kv_heads)")
    return DecodeBatch(
        block_size=draw(st.sampled_from([1, 2, 4, 8]), label="block_size"),
        num_heads=heads[0],
        num_kv_heads=heads[1],
        seq_lens=tuple(draw(st.lists(st.integers(1, max_len), min_size=1, max_size=3))),
        seed=draw(seeds, label="seed"),
        scores_below_zero=scores_below_zero,
    )


def _check_decode(impl, spec: DecodeBatch, scale: float, why_not_finite: str = "") -> None:
    """paged_decode on copies of `spec`'s tensors against the float64 formula; every argument
    is checked unchanged. `why_not_finite`: what an inf/nan output most likely means here."""
    batch = spec.tensors
    device = _device()
    names = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")
    args = [batch[name].to(device, copy=True) for name in names]
    given = [arg.clone() for arg in args]
    out = impl.paged_decode(*args, scale).cpu()
    for name, now, was in zip(names, args, given):
        assert torch.equal(now, was), f"paged_decode changed its argument {name}: it only reads"
    assert out.shape == batch["query"].shape
    for i, (k, v) in enumerate(zip(batch["ks"], batch["vs"])):
        expected = causal_attention_oracle(batch["query"][i : i + 1], k, v, scale)[0]
        error = (out[i].double() - expected).abs().max()
        assert torch.isfinite(out[i]).all(), (
            f"sequence {i} (seq_len {len(k)}): inf/nan in the output{why_not_finite}"
        )
        assert torch.allclose(out[i].double(), expected, atol=1e-4, rtol=1e-3), (
            f"sequence {i} (seq_len {len(k)}): max error {error:.3g}"
        )


@lesson_settings(6)
@given(
    num_tokens=st.integers(1, 6),
    heads=st.sampled_from([1, 2, 4]),
    block_size=st.sampled_from([1, 4, 8]),
    seed=seeds,
)
# Always tried: more tokens than 4 blocks of 1 slot hold (the pool must grow to fit them).
@example(num_tokens=6, heads=1, block_size=1, seed=0)
@show_inputs
def test_store_writes_each_token_to_its_slot_and_nothing_else(
    impl, num_tokens, heads, block_size, seed
):
    """Each token's K and V land in its slot, a padding token (slot -1) writes nothing, and
    nothing else in the cache changes."""
    pool = max(4, -(-num_tokens // block_size))  # room for every token in a slot of its own
    slots = random.Random(seed).sample(range(pool * block_size), num_tokens)
    padding = random.Random(seed + 1).sample(range(num_tokens), num_tokens // 3)
    for t in padding:
        slots[t] = -1  # a padding token: nothing may be written
    key = randn(seed, num_tokens, heads, HEAD_DIM)
    value = randn(seed + 1, num_tokens, heads, HEAD_DIM)
    key_cache = randn(seed + 2, pool, block_size, heads, HEAD_DIM)
    value_cache = randn(seed + 3, pool, block_size, heads, HEAD_DIM)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slots):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = key[t]
            expected_v[slot // block_size, slot % block_size] = value[t]
    device = _device()
    key_cache, value_cache = key_cache.to(device), value_cache.to(device)
    impl.store_kvcache(
        key.to(device), value.to(device), key_cache, value_cache, torch.tensor(slots).to(device)
    )
    assert torch.equal(key_cache.cpu(), expected_k), "the key cache is not what the slots say"
    assert torch.equal(value_cache.cpu(), expected_v), "the value cache is not what the slots say"


@lesson_settings(4)
@given(batch=decode_batches())
# Always tried first: GQA with 2 KV heads, and a context longer than one loop step (BLOCK_N 16).
@example(batch=DecodeBatch(block_size=2, num_heads=4, num_kv_heads=2, seq_lens=(21, 5), seed=1))
@show_inputs
def test_decode_matches_attention(impl, batch):
    """Each sequence's output is attention over its own context, read through its block table."""
    _check_decode(impl, batch, HEAD_DIM**-0.5)


@lesson_settings(3)
@given(batch=decode_batches(max_len=20))
@show_inputs
def test_decode_survives_large_scores(impl, batch):
    """Scores in the thousands: exp() overflows unless the running maximum is subtracted."""
    _check_decode(impl, batch, 30.0, ": exp() overflowed (subtract the running maximum)")


@lesson_settings(2)
@given(batch=decode_batches(max_len=20, scores_below_zero=True))
@example(
    batch=DecodeBatch(
        block_size=4, num_heads=2, num_kv_heads=1, seq_lens=(3,), seed=5, scores_below_zero=True
    )
)
@show_inputs
def test_decode_survives_scores_far_below_zero(impl, batch):
    """Every score of a sequence far below zero (under -120): the running maximum must start at
    -inf, not 0, or every exp() underflows to 0 and the output is 0 / 0."""
    _check_decode(impl, batch, 30.0, ": does the running maximum start at 0 instead of -inf?")
