"""The VNNI int8 matmul with 16 features a vector (kernels/cpu_quantized_matmul_vnni.{py,c}) and
the backend's choice of it.

Its oracle is the int8 kernel's (`quantized_matmul_ref`: x rounded to int8 blocks as both kernels
round it, W dequantized by models/gguf_quants.py, which is `gguf`'s dequantization bit for bit),
here in float64. The int32 sums are exact, so only float32 rounding is left. For Q8_0 and
Q4_0 (w = d q, exact in float32) each block's term (dx dw) C takes two roundings (the product of
the scales, then the FMA into the accumulator) and the sum over nb blocks nb more, so
|y - oracle| <= (nb + 2) 2^-24 sum_j |x^_j w_j|. Q4_1 adds each block's mw sx (sx = dx s itself
rounded, then an FMA): its w = dw n + mw is rounded in float32 by the dequantization too, so it
gets the same bound over |x^| |w| plus the same again over |mw| |sx|, summed per block.
The row-by-row int8 kernel obeys the same bound, so the two kernels are within twice it.
The tests skip where `load()` is None (a CPU without avx512_vnni / avx512bw, or no compiler)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_gguf import random_blocks

from nanovllm.backends import cpu_quantized, cpu_quantized_int8
from nanovllm.kernels import cpu_quantized_matmul_int8, cpu_quantized_matmul_vnni
from nanovllm.kernels.cpu_quantized_matmul_int8 import quantize_rows_ref
from nanovllm.models.gguf_quants import QuantizedTensor, dequantize

needs_vnni = pytest.mark.skipif(
    cpu_quantized_matmul_vnni.load() is None,
    reason="the VNNI kernel is not built here (the CPU lacks avx512_vnni or avx512bw, or no compiler)",
)


def float32_bound(x: torch.Tensor, raw: np.ndarray, qtype: str) -> torch.Tensor:
    """[M, N] float64: how far the kernel may be from the float64 oracle (the module docstring)."""
    w = dequantize(torch.from_numpy(raw), qtype).double()
    qx, dx = quantize_rows_ref(x)
    x_rounded = (qx * dx).reshape(x.shape).double()
    nb = x.shape[1] // 32
    bound = (nb + 2) * 2.0**-24 * (x_rounded.abs() @ w.abs().T)
    if qtype == "Q4_1":  # + per block |mw| |sx|: mw from bytes 2..3 of each block
        blocks = raw.reshape(raw.shape[0], nb, 20)
        mw = torch.from_numpy(blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64))
        sx = (qx.sum(-1) * dx[..., 0]).double().abs()  # [M, nb]
        bound = bound + (nb + 2) * 2.0**-24 * (sx @ mw.abs().T)
    return bound


def oracle(x: torch.Tensor, raw: np.ndarray, qtype: str) -> torch.Tensor:
    """[M, N] float64: x rounded as the kernels round it, times W dequantized, in float64."""
    w = dequantize(torch.from_numpy(raw), qtype).double()
    qx, dx = quantize_rows_ref(x)
    return (qx * dx).reshape(x.shape).double() @ w.T


@needs_vnni
@settings(max_examples=examples(40), deadline=None)
@given(
    qtype=st.sampled_from(list(cpu_quantized_matmul_vnni.QTYPES)),
    rows=st.integers(1, 70),  # micro-kernels of 4 rows and a partial one
    out_features=st.integers(1, 70),  # panels of 32 features and a partial one
    blocks=st.integers(1, 10),  # K = 32..320
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_vnni_matmul_matches_its_oracle_and_the_int8_kernel(
    qtype, rows, out_features, blocks, threads, seed
):
    raw = random_blocks(out_features, blocks, qtype, seed)
    x = torch.from_numpy(
        np.random.default_rng(seed + 1).standard_normal((rows, 32 * blocks)).astype(np.float32)
    )
    assert cpu_quantized_matmul_vnni.applies(x, qtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = cpu_quantized_matmul_vnni.quantized_matmul(x, torch.from_numpy(raw), qtype)
        y8 = cpu_quantized_matmul_int8.quantized_matmul(x, torch.from_numpy(raw), qtype)
    finally:
        torch.set_num_threads(before)
    assert y.shape == (rows, out_features) and y.dtype == torch.float32
    bound = float32_bound(x, raw, qtype)
    assert ((y.double() - oracle(x, raw, qtype)).abs() <= bound + 1e-30).all()
    assert ((y.double() - y8.double()).abs() <= 2 * bound + 1e-30).all()


@needs_vnni
@pytest.mark.parametrize("qtype", list(cpu_quantized_matmul_vnni.QTYPES))
@pytest.mark.parametrize("threads", [1, 3])
def test_a_prefill_in_row_blocks(qtype, threads):
    """Past the property's sizes: 301 rows (two row blocks of 256, the last micro-kernel of one
    row) x 16 blocks, enough blocks of x (4,816) that the threads round x between them."""
    raw = random_blocks(45, 16, qtype, 3)
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((301, 512)).astype(np.float32))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = cpu_quantized_matmul_vnni.quantized_matmul(x, torch.from_numpy(raw), qtype)
    finally:
        torch.set_num_threads(before)
    bound = float32_bound(x, raw, qtype)
    assert ((y.double() - oracle(x, raw, qtype)).abs() <= bound + 1e-30).all()


@needs_vnni
@pytest.mark.parametrize("qtype", list(cpu_quantized_matmul_vnni.QTYPES))
def test_x_is_rounded_as_the_int8_kernel_rounds_it(qtype):
    """qx and dx bit for bit as the int8 kernel's C `quantize_rows_q8` (halves away from zero,
    C's roundf, at values k + 1/2 steps of their block; a block of zeros, dx = 0; random rows),
    sx and the offset term from them."""
    steps = torch.tensor([127.0, -127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5] * 4)
    x = torch.cat([torch.stack([steps * 0.01, torch.zeros(32), steps * 3.0]).reshape(1, 96),
                   torch.randn(4, 96)])  # fmt: skip
    qx = torch.empty(5, 96, dtype=torch.int8)
    dx, sx = torch.empty(5, 3), torch.empty(5, 3)
    off = torch.empty(5, 3, dtype=torch.int32)
    pointers = (t.data_ptr() for t in (qx, dx, sx, off))
    code = cpu_quantized_matmul_vnni.QTYPES[qtype]
    cpu_quantized_matmul_vnni.load().quantize_x_vnni(x.data_ptr(), 5, 96, code, *pointers)
    xu, dx8, sx8 = torch.empty(5, 96, dtype=torch.uint8), torch.empty(5, 24), torch.empty(5, 3)
    pointers = (t.data_ptr() for t in (xu, dx8, sx8))
    cpu_quantized_matmul_int8.load().quantize_rows_q8(x.data_ptr(), 5, 96, *pointers)
    assert torch.equal(qx.int(), xu.int() - 128) and torch.equal(dx, dx8[:, ::8])
    assert torch.equal(sx, sx8)
    s = qx.int().reshape(5, 3, 32).sum(-1)
    assert torch.equal(off, {"Q8_0": -128, "Q4_0": -8, "Q4_1": 0}[qtype] * s)


@needs_vnni
def test_bad_shapes_and_types_are_clear_errors():
    raw = torch.from_numpy(random_blocks(4, 2, "Q8_0", 0))
    with pytest.raises(ValueError, match="x has 48 features"):
        cpu_quantized_matmul_vnni.quantized_matmul(torch.zeros(1, 48), raw, "Q8_0")
    with pytest.raises(ValueError, match="raw has shape \\(4, 68\\)"):
        cpu_quantized_matmul_vnni.quantized_matmul(torch.zeros(1, 96), raw, "Q8_0")
    with pytest.raises(ValueError, match="'Q6_K'"):
        cpu_quantized_matmul_vnni.quantized_matmul(torch.zeros(1, 256), raw, "Q6_K")


def test_k_quants_are_left_to_the_int8_kernel():
    x = torch.zeros(2, 256)
    for qtype in ("Q4_K", "Q5_K", "Q6_K"):
        assert not cpu_quantized_matmul_vnni.applies(x, qtype)


def test_a_cpu_without_vnni_gets_one_notice_and_no_library(caplog):
    with caplog.at_level(logging.WARNING, logger="nanovllm.kernels"):
        lib = cpu_quantized_matmul_vnni._build("flags : fpu sse2 avx2 avx512f avx512bw")
    assert lib is None
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "does not list avx512_vnni" in notices[0], notices


@needs_vnni
@pytest.mark.parametrize("qtype", list(cpu_quantized_matmul_vnni.QTYPES))
@pytest.mark.parametrize("rows", [3, 100])  # a decode batch, a prefill past KERNEL_MAX_ROWS
def test_the_int8_layers_use_it_and_agree_with_the_reference(monkeypatch, qtype, rows):
    """`int8_quantized_linear` (no AMX) sends Q8_0 / Q4_0 / Q4_1 to this kernel at any number of
    rows (bias added), and a K-quant to the row-by-row kernel; the name says so."""
    calls = []
    vnni = cpu_quantized_matmul_vnni.quantized_matmul
    monkeypatch.setattr(
        cpu_quantized_matmul_vnni, "quantized_matmul", lambda *a: calls.append(a[2]) or vnni(*a)
    )
    raw = random_blocks(40, 3, qtype, 5)
    qweight = QuantizedTensor(torch.from_numpy(raw), qtype, 96)
    x, bias = torch.randn(rows, 96), torch.randn(40)
    y = cpu_quantized_int8.int8_quantized_linear(x, qweight, bias)
    assert calls == [qtype]
    error = (y.double() - bias.double() - oracle(x, raw, qtype)).abs()
    assert (error <= float32_bound(x, raw, qtype) + 2.0**-23 * y.double().abs()).all()  # (+ b)
    qweight = QuantizedTensor(torch.from_numpy(random_blocks(8, 1, "Q6_K", 1)), "Q6_K", 256)
    y = cpu_quantized_int8.int8_quantized_linear(torch.randn(3, 256), qweight, None)
    assert calls == [qtype] and y.shape == (3, 8)
    if cpu_quantized_int8.int8_quantized_classes() is cpu_quantized_int8.INT8_QUANTIZED_CLASSES:
        name = cpu_quantized.quantized_kernel_name(int8_activations=True)
        assert name == "int8 C kernel (AVX-512 VNNI, 16 features a vector)"


def test_without_the_library_the_row_by_row_kernel_serves(monkeypatch):
    """`load()` None (a CPU without avx512_vnni, a failed build): the int8 layers call the
    row-by-row kernel as before, and the name says which sums it has."""
    if cpu_quantized_matmul_int8.load() is None:
        pytest.skip("no C compiler: the int8 kernel is not built")
    monkeypatch.setattr(cpu_quantized_matmul_vnni, "load", lambda: None)
    calls = []
    int8 = cpu_quantized_matmul_int8.quantized_matmul
    monkeypatch.setattr(
        cpu_quantized_matmul_int8, "quantized_matmul", lambda *a: calls.append(a[2]) or int8(*a)
    )
    qweight = QuantizedTensor(torch.from_numpy(random_blocks(8, 2, "Q4_0", 1)), "Q4_0", 64)
    y = cpu_quantized_int8.int8_quantized_linear(torch.randn(3, 64), qweight, None)
    assert calls == ["Q4_0"] and y.shape == (3, 8)
    if cpu_quantized_int8.int8_quantized_classes() is cpu_quantized_int8.INT8_QUANTIZED_CLASSES:
        name = cpu_quantized.quantized_kernel_name(int8_activations=True)
        assert name == f"int8 C kernel ({cpu_quantized_matmul_int8.instruction_set()})"


@needs_vnni
@settings(max_examples=examples(40), deadline=None)
@given(
    qtype=st.sampled_from(list(cpu_quantized_matmul_vnni.QTYPES)),
    rows=st.integers(1, 40),
    out_features=st.integers(1, 70),  # panels of 32 features and a partial one (padded)
    blocks=st.integers(1, 10),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_packed_once_the_weight_gives_the_same_product_and_unpacks_to_the_file(
    qtype, rows, out_features, blocks, threads, seed
):
    """`pack` (C) packs W's bytes as `pack_ref` (torch) does, `unpack` gives every row back as
    the file stores it (the padding: the last row again), any rows in any order; and the
    product with the packed panels is the per-call product bit for bit (the same micro-kernel),
    within the oracle's bound."""
    raw = torch.from_numpy(random_blocks(out_features, blocks, qtype, seed))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        packed = cpu_quantized_matmul_vnni.pack(raw, qtype)
        x = torch.from_numpy(
            np.random.default_rng(seed + 1).standard_normal((rows, 32 * blocks)).astype(np.float32)
        )
        y = cpu_quantized_matmul_vnni.quantized_matmul_packed(x, packed, qtype, out_features)
        y_per_call = cpu_quantized_matmul_vnni.quantized_matmul(x, raw, qtype)
    finally:
        torch.set_num_threads(before)
    panels = -(-out_features // 32)
    assert packed.shape == (32 * panels, raw.shape[1]) and packed.dtype == torch.uint8
    assert torch.equal(packed, cpu_quantized_matmul_vnni.pack_ref(raw, qtype))
    unpacked = cpu_quantized_matmul_vnni.unpack(packed, qtype)
    assert torch.equal(unpacked[:out_features], raw)
    assert (unpacked[out_features:] == raw[-1]).all()  # the padding
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, out_features, 7))
    assert torch.equal(cpu_quantized_matmul_vnni.unpack(packed, qtype, ids), raw[ids])
    assert torch.equal(y, y_per_call)
    bound = float32_bound(x, raw.numpy(), qtype)
    assert ((y.double() - oracle(x, raw.numpy(), qtype)).abs() <= bound + 1e-30).all()


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(list(cpu_quantized_matmul_vnni.QTYPES)),
    out_features=st.integers(1, 70),
    blocks=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_the_torch_packing_unpacks_to_the_file_on_any_cpu(qtype, out_features, blocks, seed):
    """`pack_ref` and `unpack` (both torch): a permutation of the same bytes and its inverse;
    each panel block's quants are quad-major (quad j of feature f at [j, f]), then the
    float16 scales, feature by feature."""
    raw = torch.from_numpy(random_blocks(out_features, blocks, qtype, seed))
    packed = cpu_quantized_matmul_vnni.pack_ref(raw, qtype)
    assert packed.shape == (32 * -(-out_features // 32), raw.shape[1])
    assert torch.equal(cpu_quantized_matmul_vnni.unpack(packed, qtype)[:out_features], raw)
    block_bytes = cpu_quantized_matmul_vnni.BLOCK[qtype][1]
    first = packed.flatten()[: 32 * block_bytes]  # panel 0, block 0 (panels are contiguous)
    f, j = min(out_features - 1, 5), 2  # feature f's quad j
    quant_at = block_bytes - (32 if qtype == "Q8_0" else 16) + 4 * j
    quad = raw[f, quant_at : quant_at + 4] ^ (0x80 if qtype == "Q8_0" else 0)
    assert torch.equal(first[(j * 32 + f) * 4 : (j * 32 + f) * 4 + 4], quad)
    quant_bytes = 32 * (32 if qtype == "Q8_0" else 16)
    assert torch.equal(first[quant_bytes + 2 * f : quant_bytes + 2 * f + 2], raw[f, 0:2])


@needs_vnni
def test_the_packed_product_rejects_what_does_not_fit():
    packed = cpu_quantized_matmul_vnni.pack(
        torch.from_numpy(random_blocks(40, 2, "Q4_0", 0)), "Q4_0"
    )
    with pytest.raises(ValueError, match="W's 65 do not fit"):
        cpu_quantized_matmul_vnni.quantized_matmul_packed(torch.zeros(1, 64), packed, "Q4_0", 65)
    with pytest.raises(ValueError, match="x has 96 features"):
        cpu_quantized_matmul_vnni.quantized_matmul_packed(torch.zeros(1, 96), packed, "Q4_0", 40)
    with pytest.raises(ValueError, match="'Q4_K'"):
        cpu_quantized_matmul_vnni.pack(torch.from_numpy(random_blocks(4, 1, "Q4_K", 0)), "Q4_K")
