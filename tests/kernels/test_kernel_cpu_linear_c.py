"""The C linear kernel (kernels/cpu_linear_c.{py,c}): y = x W^T + b through panels of 32 features.

Oracle: the product in float64. The kernel sums each output over the input features in order in
float32, so each output must lie within K * 2^-23 * sum_k |x_k w_k| (+ |b| * 2^-24) of it: a
derived bound, not a tolerance picked to pass. The packing's oracle is its torch reference
(`pack_ref`) and its inverse (`unpack`), checked on any CPU; the product's tests skip where
`load()` is None (a CPU without avx512f, or no compiler).
"""

from __future__ import annotations

import logging

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.kernels import cpu_linear_c

needs_c = pytest.mark.skipif(
    cpu_linear_c.load() is None, reason="the C linear kernel is not built here (no avx512f)"
)


def check_against_float64(x, w, b, got) -> None:
    """got within the float32 in-order summation bound of the float64 product."""
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    in_features = x.shape[-1]
    bound = (x.double().abs() @ w.double().abs().T) * in_features * 2.0**-23
    if b is not None:
        bound = bound + b.double().abs() * 2.0**-24
    error = (got.double() - want).abs()
    assert bool((error <= bound + 1e-30).all()), float((error - bound).max())


@needs_c
@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 40),
    in_features=st.integers(1, 200),
    out_features=st.integers(1, 100),
    bias=st.booleans(),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_the_product_is_the_float64_one_within_the_summation_bound(
    rows, in_features, out_features, bias, threads, seed
) -> None:
    """Any rows (the 8-row tiles and every tail of 1-7), any features (panels with 1-32 valid
    columns: the last is masked), with and without bias, on 1-3 threads."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=g)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_linear_c.linear(x, cpu_linear_c.pack(w), out_features, b)
    finally:
        torch.set_num_threads(before)
    assert got.shape == (rows, out_features)
    check_against_float64(x, w, b, got)


@needs_c
def test_a_prefill_past_one_row_chunk_and_a_batch_of_token_rows() -> None:
    """1,100 rows (the C file's ROW_CHUNK is 1,024: two passes over the panels), and x with
    leading dimensions [2, 3, in]."""
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(70, 96, generator=g), torch.randn(70, generator=g)
    x = torch.randn(1100, 96, generator=g)
    check_against_float64(x, w, b, cpu_linear_c.linear(x, cpu_linear_c.pack(w), 70, b))
    x = torch.randn(2, 3, 96, generator=g)
    got = cpu_linear_c.linear(x, cpu_linear_c.pack(w), 70, b)
    assert got.shape == (2, 3, 70)
    check_against_float64(x.view(6, 96), w, b, got.view(6, 70))


def test_packing_puts_each_weight_in_its_panel_and_unpacking_gives_it_back() -> None:
    """pack_ref on any CPU: panels[p, k, j] = W[32 p + j, k], zeros past the last feature."""
    w = torch.randn(70, 5)
    panels = cpu_linear_c.pack_ref(w)
    assert panels.shape == (3, 5, 32) and panels.is_contiguous()
    assert panels[1, 4, 7] == w[39, 4] and panels[2, 0, 5] == w[69, 0]
    assert not panels[2, :, 6:].any()  # features 70..95 do not exist
    assert torch.equal(cpu_linear_c.unpack(panels, 70), w)


@needs_c
def test_bad_arguments_are_named() -> None:
    w = torch.randn(40, 24)
    panels = cpu_linear_c.pack(w)
    with pytest.raises(ValueError, match=r"x torch.float32 \(3, 23\) does not fit panels"):
        cpu_linear_c.linear(torch.randn(3, 23), panels, 40)
    with pytest.raises(ValueError, match="does not fit"):
        cpu_linear_c.linear(torch.randn(3, 24, dtype=torch.float64), panels, 40)
    with pytest.raises(ValueError, match="for 65 output features"):
        cpu_linear_c.linear(torch.randn(3, 24), panels, 65)
    with pytest.raises(ValueError, match="for 20 output features"):  # panels of another weight
        cpu_linear_c.linear(torch.randn(3, 24), panels, 20)
    with pytest.raises(ValueError, match=r"bias torch.float32 \(39,\)"):
        cpu_linear_c.linear(torch.randn(3, 24), panels, 40, torch.randn(39))
    with pytest.raises(ValueError, match="packs a 2-D float32 CPU weight, not torch.bfloat16"):
        cpu_linear_c.pack(w.bfloat16())


def test_a_cpu_without_avx512f_gets_one_notice_and_no_library(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="nanovllm.kernels"):
        lib = cpu_linear_c._build("flags : fpu sse2 avx avx2 fma")
    assert lib is None
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "does not list avx512f" in notices[0], notices
    assert "oneDNN's packed matmul instead" in notices[0]
