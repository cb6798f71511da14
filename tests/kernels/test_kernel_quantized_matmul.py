"""The numba quantized matmul (kernels/cpu_quantized_matmul*.py) against the reference,
dequantize-then-`F.linear` (models/quantized_linear.py), and against `gguf`'s own dequantization
multiplied in float64; and its dequantization against `gguf`'s, bit for bit, on blocks of
random bytes (every scale a float16 bit pattern, subnormals, infinities and NaNs among them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_gguf import random_blocks

gguf = pytest.importorskip("gguf")
pytest.importorskip("numba")

from nanovllm.kernels import cpu_quantized_matmul  # noqa: E402
from nanovllm.models.gguf_quants import FORMATS, QuantizedTensor  # noqa: E402
from nanovllm.models.quantized_linear import dequantize_linear  # noqa: E402


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(["Q8_0", "Q4_0", "Q4_1"]),  # (gguf quantizes to these)
    rows=st.integers(1, 5),
    out_features=st.integers(1, 40),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_numba_matmul_matches_the_reference_and_gguf(qtype, rows, out_features, blocks, seed):
    generator = np.random.default_rng(seed)
    columns = 32 * blocks
    weight = generator.standard_normal((out_features, columns)).astype(np.float32)
    raw = gguf.quants.quantize(weight, gguf.GGMLQuantizationType[qtype])
    x = torch.from_numpy(generator.standard_normal((rows, columns)).astype(np.float32))
    assert cpu_quantized_matmul.applies(x, qtype)
    y = cpu_quantized_matmul.quantized_matmul(x, torch.from_numpy(raw), qtype)
    reference = dequantize_linear(x, QuantizedTensor(raw, qtype, columns), None)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).astype(np.float64)
    exact = torch.from_numpy(x.numpy().astype(np.float64) @ theirs.T)
    assert y.shape == (rows, out_features)
    torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)


@settings(max_examples=examples(20), deadline=None)
@given(
    qtype=st.sampled_from(["Q4_K", "Q5_K", "Q6_K"]),
    rows=st.integers(1, 5),
    out_features=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_numba_matmul_of_k_quants_matches_the_reference_and_gguf(qtype, rows, out_features, seed):
    raw = random_blocks(out_features, 1, qtype, seed)  # (gguf cannot quantize to K-quants)
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, 256), np.float32))
    assert cpu_quantized_matmul.applies(x, qtype)
    y = cpu_quantized_matmul.quantized_matmul(x, torch.from_numpy(raw), qtype)
    reference = dequantize_linear(x, QuantizedTensor(raw, qtype, 256), None)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).astype(np.float64)
    exact = torch.from_numpy(x.numpy().astype(np.float64) @ theirs.T)
    scale = exact.abs().max().item() + 1
    torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5 * scale)


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(sorted(cpu_quantized_matmul.QTYPES)),
    out_features=st.integers(1, 9),
    blocks=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_numba_dequantize_is_gguf_bit_for_bit(qtype, out_features, blocks, seed):
    generator = np.random.default_rng(seed)
    raw = generator.integers(0, 256, (out_features, blocks * FORMATS[qtype].block_bytes), np.uint8)
    ours = cpu_quantized_matmul.dequantize(torch.from_numpy(raw), qtype).numpy()
    with np.errstate(invalid="ignore", over="ignore"):  # (infinite or NaN scales, on purpose)
        theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs)  # (NaNs in the same places)
