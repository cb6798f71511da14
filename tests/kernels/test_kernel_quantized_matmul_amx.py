"""The AMX int8 quantized matmul (kernels/cpu_quantized_matmul_amx.{py,c}) and how the backend
chooses it.

Its oracle is the int8 kernel's (`quantized_matmul_ref`: x rounded to int8 blocks as both kernels
round it, W dequantized by models/gguf_quants.py, `gguf`'s dequantization bit for bit), here in
float64. The tiles' int32 sums are exact; what is left is float32 rounding in the scaling: for
Q8_0 and Q4_0 (w = d q, exact in float32) each block's term dx dw C takes at most two roundings
(dx dw, then the FMA) and the sum over nb blocks at most nb more, so
|y - oracle| <= (nb + 2) 2^-24 sum_j |x^_j w_j|. Q4_1 adds each block's mw sx, a float32 sum of
its own, held to the int8 test's relative bound, as are Q4_K's and Q5_K's (the same form). The kernel's tests skip on a CPU without AMX;
the choice of the VNNI kernel there is tested everywhere."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_gguf import random_blocks

from nanovllm.backends import cpu_quantized_int8
from nanovllm.kernels import cpu_quantized_matmul_amx
from nanovllm.kernels.cpu_quantized_matmul_int8 import quantize_rows_ref
from nanovllm.models.gguf_quants import FORMATS, QuantizedTensor, dequantize

needs_amx = pytest.mark.skipif(
    cpu_quantized_matmul_amx.load() is None,
    reason="no AMX here (the CPU lacks amx_int8, or no compiler, or Linux refused the tiles)",
)


@needs_amx
@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(list(cpu_quantized_matmul_amx.QTYPES)),
    rows=st.sampled_from([1, 3, 16, 17, 40, 130]),  # tiles of 16 rows, panels of 128
    out_features=st.integers(1, 40),  # tiles of 16 features, a partial one
    blocks=st.integers(1, 6),  # (of 256 for the K-quants)
    seed=st.integers(0, 2**16),
)
def test_amx_matmul_matches_its_oracle(qtype, rows, out_features, blocks, seed):
    if FORMATS[qtype].block_size == 256:
        blocks = min(blocks, 2)  # (super-blocks of 8 of 32: enough, and cheap)
    columns = FORMATS[qtype].block_size * blocks
    raw = random_blocks(out_features, blocks, qtype, seed)
    x = torch.from_numpy(
        np.random.default_rng(seed + 1).standard_normal((rows, columns)).astype(np.float32)
    )
    assert cpu_quantized_matmul_amx.applies(x, qtype)
    y = cpu_quantized_matmul_amx.quantized_matmul(x, torch.from_numpy(raw), qtype)
    assert y.shape == (rows, out_features) and y.dtype == torch.float32
    w = dequantize(torch.from_numpy(raw), qtype).double()
    qx, dx = quantize_rows_ref(x)
    x_rounded = (qx * dx).reshape(x.shape).double()
    oracle = x_rounded @ w.T
    if qtype in ("Q4_1", "Q4_K", "Q5_K"):
        scale = float(x.abs().amax() * w.abs().amax(1).clamp_min(1e-30).mean()) * columns**0.5
        torch.testing.assert_close(y.double(), oracle, rtol=1e-4, atol=1e-5 * scale)
    else:
        bound = (columns // 32 + 2) * 2.0**-24 * (x_rounded.abs() @ w.abs().T)
        assert ((y.double() - oracle).abs() <= bound + 1e-30).all()


@needs_amx
def test_bad_shapes_and_types_are_clear_errors():
    raw = torch.from_numpy(random_blocks(4, 2, "Q8_0", 0))
    with pytest.raises(ValueError, match="x has 48 features"):
        cpu_quantized_matmul_amx.quantized_matmul(torch.zeros(1, 48), raw, "Q8_0")
    with pytest.raises(ValueError, match="qtype must be one of"):
        cpu_quantized_matmul_amx.quantized_matmul(torch.zeros(1, 64), raw, "Q6_K")


def test_a_cpu_without_amx_gets_one_notice_and_no_library(caplog):
    """The CPU's flags decide first: without amx_int8 nothing is compiled, and the notice says why."""
    with caplog.at_level(logging.WARNING, logger="nanovllm.kernels"):
        lib = cpu_quantized_matmul_amx._build("flags : fpu sse2 avx2 avx512f avx512_vnni")
    assert lib is None
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "does not list amx_int8" in notices[0], notices


def test_the_backend_chooses_amx_layers_only_where_the_kernel_loads(monkeypatch):
    monkeypatch.setattr(cpu_quantized_matmul_amx, "load", lambda: None)
    chosen = cpu_quantized_int8.int8_quantized_classes()
    assert chosen is cpu_quantized_int8.INT8_QUANTIZED_CLASSES
    assert not any(getattr(cls, "amx", False) for cls in chosen.values())
    monkeypatch.setattr(cpu_quantized_matmul_amx, "load", lambda: object())
    chosen = cpu_quantized_int8.int8_quantized_classes()
    assert chosen is cpu_quantized_int8.AMX_QUANTIZED_CLASSES
    assert all(chosen[kind].amx for kind in ("qkv", "merged_column", "row", "lm_head"))


@needs_amx
def test_amx_layers_take_any_rows_and_leave_other_types_to_vnni(monkeypatch):
    """An AMX layer multiplies a prefill's rows (above the VNNI kernel's 64) on AMX; a type the
    AMX kernel lacks (Q6_K) goes to the VNNI kernel, as in the int8 layers."""
    calls = []
    amx = cpu_quantized_matmul_amx.quantized_matmul
    monkeypatch.setattr(
        cpu_quantized_matmul_amx,
        "quantized_matmul",
        lambda *a: calls.append(a[2]) or amx(*a),
    )
    qweight = QuantizedTensor(torch.from_numpy(random_blocks(8, 2, "Q8_0", 1)), "Q8_0", 64)
    y = cpu_quantized_int8.int8_quantized_linear(torch.randn(100, 64), qweight, None, amx=True)
    assert calls == ["Q8_0"] and y.shape == (100, 8)
    qweight = QuantizedTensor(torch.from_numpy(random_blocks(8, 1, "Q6_K", 1)), "Q6_K", 256)
    y = cpu_quantized_int8.int8_quantized_linear(torch.randn(3, 256), qweight, None, amx=True)
    assert calls == ["Q8_0"] and y.shape == (3, 8)
