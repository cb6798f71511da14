"""GGUF block formats kept quantized (models/gguf_quants.py, models/quantized_linear.py): the
reference dequantization is the `gguf` package's, bit for bit; a `QuantizedTensor`'s narrowing
and copying is the same as on the dequantized tensor; a quantized layer loads through the plain
weight loaders to the same weights a dense one holds, a fused layer of mixed types included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from tiny_gguf import random_blocks  # noqa: E402

from nanovllm.models.gguf_quants import FORMATS, KEPT_TYPES, QuantizedTensor, dequantize  # noqa: E402
from nanovllm.models.linear import QKVParallelLinear  # noqa: E402
from nanovllm.models.quantized_linear import QuantizedQKVParallelLinear  # noqa: E402


def quantized(rows: int, columns: int, qtype: str, seed: int) -> np.ndarray:
    """A random float32 [rows, columns] through `gguf.quants.quantize`: uint8 blocks (random
    blocks for the K-quants, which `gguf` does not quantize to)."""
    if qtype.endswith("_K"):
        return random_blocks(rows, columns // FORMATS[qtype].block_size, qtype, seed)
    weight = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)
    return gguf.quants.quantize(weight, gguf.GGMLQuantizationType[qtype])


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(KEPT_TYPES),
    rows=st.integers(1, 9),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_dequantize_is_gguf_bit_for_bit(qtype, rows, blocks, seed):
    columns = FORMATS[qtype].block_size * blocks
    raw = quantized(rows, columns, qtype, seed)
    ours = dequantize(torch.from_numpy(raw), qtype)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    assert ours.shape == (rows, columns)
    assert np.array_equal(bits(ours.numpy()), bits(theirs))


@settings(max_examples=examples(20), deadline=None)
@given(
    qtype=st.sampled_from(KEPT_TYPES),
    rows=st.integers(2, 8),
    blocks=st.integers(2, 4),
    data=st.data(),
)
def test_narrow_and_copy_act_on_the_dequantized_values(qtype, rows, blocks, data):
    size = FORMATS[qtype].block_size  # (32, or a K-quant's 256)
    raw = quantized(rows, size * blocks, qtype, seed=rows * blocks)
    source = QuantizedTensor(raw, qtype, size * blocks)  # (a numpy view, as the file's)
    dense = source.dequantize()
    r0 = data.draw(st.integers(0, rows - 1))
    n = data.draw(st.integers(1, rows - r0))
    b0 = data.draw(st.integers(0, blocks - 1))
    nb = data.draw(st.integers(1, blocks - b0))
    piece = source.narrow(0, r0, n).narrow(1, size * b0, size * nb)
    assert torch.equal(piece.dequantize(), dense[r0 : r0 + n, size * b0 : size * (b0 + nb)])
    target = QuantizedTensor.empty((rows, size * blocks), qtype).zero_()
    target[r0 : r0 + n].copy_(source.narrow(0, r0, n))
    expected = torch.zeros_like(dense)
    expected[r0 : r0 + n] = dense[r0 : r0 + n]
    assert torch.equal(target.dequantize(), expected)


def test_bad_cuts_and_types_are_clear_errors():
    source = QuantizedTensor(quantized(2, 64, "Q8_0", 0), "Q8_0", 64)
    with pytest.raises(ValueError, match=r"whole blocks of 32: narrow\(1, 16, 32\)"):
        source.narrow(1, 16, 32)
    with pytest.raises(ValueError, match="cannot copy Q4_0 weights into Q8_0"):
        QuantizedTensor.empty((2, 64), "Q8_0").copy_(
            QuantizedTensor(quantized(2, 64, "Q4_0", 0), "Q4_0", 64)
        )
    with pytest.raises(ValueError, match="blocks of 32 weights: 40 columns"):
        QuantizedTensor.empty((2, 40), "Q8_0")
    with pytest.raises(ValueError, match="unknown type 'Q2_K'"):
        QuantizedTensor(np.zeros((1, 4), np.uint8), "Q2_K", 1)
    with pytest.raises(ValueError, match="blocks of 256 weights: 96 columns"):
        QuantizedTensor.empty((2, 96), "Q4_K")


@pytest.mark.parametrize(
    "types", [("Q8_0", "Q8_0", "Q8_0"), ("Q8_0", "Q4_0", "Q4_1"), ("Q4_0", "F32", "Q4_0")]
)
def test_a_quantized_qkv_layer_loads_what_a_dense_one_does(types):
    """q, k and v through the plain weight loader into one fused layer: kept in their type when
    all three share it, else held as float32; either way the dense layer's weights, and its
    reference matmul is the dense layer's `F.linear` exactly."""
    hidden, head, heads, kv_heads = 64, 16, 4, 2
    dense = QKVParallelLinear(hidden, head, heads, kv_heads)
    quant = QuantizedQKVParallelLinear(hidden, head, heads, kv_heads)
    assert quant.weight.device.type == "meta"  # the parameter holds no memory
    for shard, rows, qtype in zip("qkv", (heads * head, kv_heads * head, kv_heads * head), types):
        raw = quantized(rows, hidden, qtype if qtype != "F32" else "Q8_0", seed=rows)
        tensor = QuantizedTensor(raw, "Q8_0" if qtype == "F32" else qtype, hidden)
        values = tensor.dequantize()
        loaded = values if qtype == "F32" else tensor  # (the loader's dense tensor for F32)
        dense.weight_loader(dense.weight, values, shard)
        quant.weight.weight_loader(quant.weight, loaded, shard)
    assert quant.qweight.qtype == (types[0] if len(set(types)) == 1 else "F32")
    assert torch.equal(quant.qweight.dequantize(), dense.weight)
    x = torch.randn(3, hidden)
    assert torch.equal(quant(x), dense(x))
