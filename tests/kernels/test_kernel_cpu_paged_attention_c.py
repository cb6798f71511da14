"""The C decode paged-attention kernel (kernels/cpu_paged_attention_c.{py,c}) and its dispatch.

Its oracle is `reference.paged_attention_ref`, run here in float64 on a clean copy of the caches.
The kernel sums in float32 in another order (16 keys' partial products reduced together, an
online softmax over chunks of 16, Cephes' exp within 5 ulp), so it must be within 2e-5 of the
output's scale (max |out|). The caches it reads hold NaN in every slot no sequence may see
(blocks no table lists, slots at or past seq_len in a sequence's last block): one read of such a
slot would make the output NaN. The tests skip where `load()` is None (a CPU without avx512f, or
no compiler), except the one that builds for a CPU without it.
"""

from __future__ import annotations

import logging
from unittest import mock

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.kernels import cpu_paged_attention_c
from nanovllm.kernels.cpu_paged_attention import (
    cpu_fast_path_available,
    paged_attention_cpu_planned,
    plan_paged_attention_cpu,
)
from nanovllm.kernels.reference import paged_attention_ref

needs_c = pytest.mark.skipif(
    not cpu_fast_path_available() or cpu_paged_attention_c.load() is None,
    reason="the C attention kernel is not built here (no avx512f, or no compiler), or no numba",
)


def decode_batch(
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    seed: int,
    q_lens: list[int] | None = None,
) -> tuple:
    """(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, clean caches):
    each sequence's blocks distinct ids in a shuffled order (two spare blocks that no table
    lists), every slot no sequence may see NaN in the caches (0 in the clean copies)."""
    g = torch.Generator().manual_seed(seed)
    q_lens = q_lens or [1] * len(seq_lens)
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 2
    ids = torch.randperm(num_blocks, generator=g).to(torch.int32)
    tables = torch.full((len(seq_lens), max(blocks)), -1, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    kc, vc = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    used = 0
    for i, (n, nb) in enumerate(zip(seq_lens, blocks)):
        tables[i, :nb] = ids[used : used + nb]
        used += nb
        for pos in range(n):
            block, slot = int(tables[i, pos // block_size]), pos % block_size
            kc[block, slot] = torch.randn(num_kv_heads, head_dim, generator=g)
            vc[block, slot] = torch.randn(num_kv_heads, head_dim, generator=g)
    query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=g)
    starts = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return query, kc, vc, tables, lens, starts, kc.nan_to_num(0.0), vc.nan_to_num(0.0)


def oracle(query, kc, vc, tables, lens, starts, scale) -> torch.Tensor:
    """paged_attention_ref in float64 (on clean caches)."""
    return paged_attention_ref(
        query.double(), kc.double(), vc.double(), tables, lens, starts, scale
    )


def assert_within_float32(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.dtype == torch.float32 and not out.isnan().any()
    error = float((out.double() - expected).abs().max())
    assert error <= 2e-5 * float(expected.abs().max()), error


@needs_c
@settings(max_examples=examples(40), deadline=None)
@given(
    seq_lens=st.lists(st.integers(1, 100), min_size=1, max_size=12),
    block_size=st.sampled_from([1, 4, 16]),
    num_kv_heads=st.integers(1, 4),
    group=st.integers(1, 4),
    head_dim=st.sampled_from([16, 64, 128]),
    threads=st.integers(1, 3),
    all_heads=st.booleans(),  # kv_per_item: every KV head, or one
    seed=st.integers(0, 2**16),
)
def test_decode_matches_the_reference_and_never_reads_past_seq_len(
    seq_lens, block_size, num_kv_heads, group, head_dim, threads, all_heads, seed
) -> None:
    q, kc, vc, tables, lens, starts, clean_k, clean_v = decode_batch(
        seq_lens, block_size, num_kv_heads, group, head_dim, seed
    )
    scale = head_dim**-0.5
    plan = plan_paged_attention_cpu(kc, tables, lens, starts, q.shape[0], q.shape[1])
    assert cpu_paged_attention_c.applies(q, plan, None)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = cpu_paged_attention_c.attend(
            q, kc, vc, plan, scale, kv_per_item=num_kv_heads if all_heads else 1
        )
    finally:
        torch.set_num_threads(torch_threads)
    assert_within_float32(out, oracle(q, clean_k, clean_v, tables, lens, starts, scale))


@needs_c
def test_the_planned_call_sends_a_decode_step_to_the_c_kernel() -> None:
    q, kc, vc, tables, lens, starts, clean_k, clean_v = decode_batch(
        [37, 5, 64, 1], 16, 3, 3, 64, seed=1
    )
    plan = plan_paged_attention_cpu(kc, tables, lens, starts, q.shape[0], q.shape[1])
    with mock.patch.object(
        cpu_paged_attention_c, "attend", wraps=cpu_paged_attention_c.attend
    ) as attend:
        out = paged_attention_cpu_planned(q, kc, vc, plan, 0.125)
    assert attend.call_count == 1
    assert_within_float32(out, oracle(q, clean_k, clean_v, tables, lens, starts, 0.125))


@needs_c
@pytest.mark.parametrize(
    "case",
    [
        "prefill",
        "chunked prefill",
        "sliding window",
        "soft cap",
        "head_dim 72",
        "a 0-token sequence",
    ],
)
def test_what_it_does_not_serve_goes_to_numba_with_the_right_answer(case) -> None:
    seq_lens, q_lens, head_dim, window, cap = [30, 9, 17], None, 64, None, None
    if case == "prefill":
        q_lens = seq_lens
    elif case == "chunked prefill":
        q_lens = [4, 1, 1]
    elif case == "sliding window":
        window = 8
    elif case == "soft cap":
        cap = 5.0
    elif case == "head_dim 72":
        head_dim = 72
    elif case == "a 0-token sequence":  # as many tokens as sequences, but not one each
        q_lens = [2, 0, 1]
    q, kc, vc, tables, lens, starts, clean_k, clean_v = decode_batch(
        seq_lens, 4, 2, 3, head_dim, seed=2, q_lens=q_lens
    )
    scale = head_dim**-0.5
    plan = plan_paged_attention_cpu(
        clean_k, tables, lens, starts, q.shape[0], q.shape[1], sliding_window=window
    )
    assert not cpu_paged_attention_c.applies(q, plan, cap)
    with mock.patch.object(cpu_paged_attention_c, "attend") as attend:
        out = paged_attention_cpu_planned(q, clean_k, clean_v, plan, scale, logits_soft_cap=cap)
    attend.assert_not_called()
    expected = paged_attention_ref(
        *(t.double() if t.is_floating_point() else t for t in (q, clean_k, clean_v)),
        tables, lens, starts, scale, sliding_window=window, logits_soft_cap=cap,
    )  # fmt: skip
    assert_within_float32(out, expected)


needs_numba = pytest.mark.skipif(not cpu_fast_path_available(), reason="no numba (no plans)")


@needs_numba
@pytest.mark.parametrize(
    "case, served",
    [
        ("decode", True),
        ("prefill", False),
        ("a 0-token sequence", False),
        ("sliding window", False),
        ("soft cap", False),
        ("head_dim 72", False),
        ("bfloat16", False),
    ],
)
def test_which_calls_it_serves_on_any_cpu(monkeypatch, case, served) -> None:
    """`applies`, with the library standing in where the CPU cannot build it: only a
    decode-only float32 plan without window or cap, head_dim a multiple of 16."""
    monkeypatch.setattr(cpu_paged_attention_c, "load", lambda: object())
    seq_lens, q_lens, head_dim = [30, 9, 17], None, 64
    window, cap = (8 if case == "sliding window" else None), (5.0 if case == "soft cap" else None)
    if case == "prefill":
        q_lens = seq_lens
    elif case == "a 0-token sequence":  # as many tokens as sequences, but not one each
        q_lens = [2, 0, 1]
    elif case == "head_dim 72":
        head_dim = 72
    q, _, _, tables, lens, starts, clean_k, _ = decode_batch(
        seq_lens, 4, 2, 3, head_dim, seed=4, q_lens=q_lens
    )
    if case == "bfloat16":
        q = q.to(torch.bfloat16)
    plan = plan_paged_attention_cpu(
        clean_k, tables, lens, starts, q.shape[0], q.shape[1], sliding_window=window
    )
    assert cpu_paged_attention_c.applies(q, plan, cap) is served


@needs_numba
def test_the_plan_says_decode_only_from_the_query_starts() -> None:
    q, kc, *_ = decode_batch([3, 4], 4, 1, 1, 16, seed=3)
    tables = torch.tensor([[0], [1]], dtype=torch.int32)
    starts = torch.tensor([0, 1, 2], dtype=torch.int32)
    plan = plan_paged_attention_cpu(kc, tables, torch.tensor([3, 4]), starts, 2, 1)
    assert plan.decode_only
    starts = torch.tensor([0, 2, 2], dtype=torch.int32)  # two tokens, one sequence without any
    plan = plan_paged_attention_cpu(kc, tables, torch.tensor([3, 4]), starts, 2, 1)
    assert not plan.decode_only


def test_a_cpu_without_avx512f_gets_one_notice_and_no_library(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="nanovllm.kernels"):
        lib = cpu_paged_attention_c._build("flags : fpu sse2 avx avx2 fma")
    assert lib is None
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "does not list avx512f" in notices[0], notices
