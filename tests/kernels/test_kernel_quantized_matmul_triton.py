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


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_the_triton_backend_layers_call_the_kernel(qtype, monkeypatch):
    """The Triton backend's quantized layers (backends/triton_quantized.py): a Q8_0 or Q4_0
    weight goes through the kernel (to rounding of the reference, `dequantize_linear`), any
    other type through the reference itself, bit for bit."""
    from nanovllm.backends import get_backend
    from nanovllm.backends.triton_quantized import TritonQuantizedMatmul
    from nanovllm.kernels import quantized_matmul as kernel_module
    from nanovllm.models.gguf_quants import QuantizedTensor
    from nanovllm.models.model_layers import ModelLayers
    from nanovllm.models.quantized_linear import dequantize_linear

    cpu = torch.device("cpu")
    layers = get_backend("triton").quantized_layers(ModelLayers(), torch.float32, cpu, True)
    layer = layers.row(64, 24, bias=True)
    assert isinstance(layer, TritonQuantizedMatmul)
    weight = QuantizedTensor(blocks(24, 64, qtype, seed=3).numpy(), qtype, 64)
    layer.weight.weight_loader(layer.weight, weight)
    layer.bias.data.normal_()
    calls = []
    monkeypatch.setattr(
        kernel_module,
        "quantized_matmul",
        lambda *a: calls.append(a[2]) or quantized_matmul(*a),
    )
    x = torch.randn(2, 3, 64)  # (leading dimensions, as a model's hidden states)
    y = layer(x)
    reference = dequantize_linear(x, layer.qweight, layer.bias)
    if qtype == "Q4_1":
        assert calls == [] and torch.equal(y, reference)
    else:
        assert calls == [qtype]
        torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)
