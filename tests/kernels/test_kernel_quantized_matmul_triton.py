"""The Triton dequantizing matmul (kernels/quantized_matmul.py, interpreted on a CPU) against its
torch reference (kernels/quantized_matmul_reference.py), whose dequantization is the `gguf`
package's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")

from nanovllm.kernels.quantized_matmul import quantized_matmul  # noqa: E402
from nanovllm.kernels.quantized_matmul_reference import (  # noqa: E402
    dequantize_ref,
    quantized_matmul_ref,
)


def blocks(rows: int, columns: int, qtype: str, seed: int) -> torch.Tensor:
    weight = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)
    return torch.from_numpy(gguf.quants.quantize(weight, gguf.GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_reference_dequantizes_as_gguf(qtype):
    raw = blocks(5, 96, qtype, seed=1)
    theirs = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[qtype])
    assert np.array_equal(
        dequantize_ref(raw, qtype).numpy().view(np.uint32), theirs.view(np.uint32)
    )


@settings(max_examples=examples(10), deadline=None)
@given(
    qtype=st.sampled_from(["Q8_0", "Q4_0"]),
    m=st.integers(1, 20),
    n=st.integers(1, 40),
    num_blocks=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_triton_matches_reference(qtype, m, n, num_blocks, seed):
    raw = blocks(n, 32 * num_blocks, qtype, seed)
    x = torch.randn(m, 32 * num_blocks, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(
        quantized_matmul(x, raw, qtype), quantized_matmul_ref(x, raw, qtype), rtol=1e-5, atol=1e-5
    )


def test_bad_arguments_are_clear_errors():
    raw = blocks(4, 64, "Q8_0", seed=0)
    with pytest.raises(ValueError, match="qtype must be one of .* got 'Q4_1'"):
        quantized_matmul(torch.zeros(1, 64), raw, "Q4_1")
    with pytest.raises(ValueError, match="x has 96 features"):
        quantized_matmul(torch.zeros(1, 96), raw, "Q8_0")
