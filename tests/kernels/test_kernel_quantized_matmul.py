"""The numba quantized matmul (kernels/cpu_quantized_matmul*.py) against the reference,
dequantize-then-`F.linear` (models/quantized_linear.py), and against `gguf`'s own dequantization
multiplied in float64; and its float16 decoding against numpy's, for every bit pattern."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
pytest.importorskip("numba")

from nanovllm.kernels import cpu_quantized_matmul  # noqa: E402
from nanovllm.kernels.cpu_quantized_matmul_numba import _half  # noqa: E402
from nanovllm.models.gguf_quants import QuantizedTensor  # noqa: E402
from nanovllm.models.quantized_linear import dequantize_linear  # noqa: E402


def test_half_decodes_every_float16_as_numpy_does():
    from numba import njit

    @njit(cache=False)
    def decode_all(out):
        for bits in range(65536):
            out[bits] = _half(bits & 0xFF, bits >> 8)

    ours = np.empty(65536, np.float32)
    decode_all(ours)
    theirs = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    theirs = theirs.astype(np.float32)
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(sorted(cpu_quantized_matmul.QTYPES)),  # (its types: no K-quants)
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
