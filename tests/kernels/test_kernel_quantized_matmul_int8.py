"""The int8 quantized matmul (kernels/cpu_quantized_matmul_int8*.{py,c}): x rounded to int8 blocks,
integer dot products. Against its oracle in plain torch (`quantized_matmul_ref`: the same
rounding of x, then x W^T with W dequantized by models/gguf_quants.py, which is `gguf`'s own
dequantization bit for bit), to float rounding; and against the unrounded product, within
the bound that x's rounding allows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_gguf import random_blocks

from nanovllm.kernels import cpu_quantized_matmul_int8
from nanovllm.models.gguf_quants import FORMATS, KEPT_TYPES, dequantize

gguf = pytest.importorskip("gguf")
if cpu_quantized_matmul_int8.load() is None:
    pytest.skip("no C compiler: the int8 kernel is not built", allow_module_level=True)


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(KEPT_TYPES),
    rows=st.integers(1, 6),
    out_features=st.integers(1, 20),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_int8_matmul_matches_its_oracle_and_gguf(qtype, rows, out_features, blocks, seed):
    columns = FORMATS[qtype].block_size * blocks
    raw = random_blocks(out_features, blocks, qtype, seed)
    x = torch.from_numpy(
        np.random.default_rng(seed + 1).standard_normal((rows, columns)).astype(np.float32)
    )
    assert cpu_quantized_matmul_int8.applies(x, qtype)
    y = cpu_quantized_matmul_int8.quantized_matmul(x, torch.from_numpy(raw), qtype)
    w = dequantize(torch.from_numpy(raw), qtype)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    assert torch.equal(w, torch.from_numpy(theirs.astype(np.float32)))
    oracle = cpu_quantized_matmul_int8.quantized_matmul_ref(x, w)
    assert y.shape == (rows, out_features)
    scale = float(x.abs().amax() * w.abs().amax(1).clamp_min(1e-30).mean()) * columns**0.5
    torch.testing.assert_close(y, oracle, rtol=1e-4, atol=1e-5 * scale)
    # x moves by at most half a step of its block's 255: |dy| <= sum_j |w_j| max|x_block| / 254
    bound = (w.abs() @ x.abs().reshape(rows, -1, 32).amax(-1).repeat_interleave(32, 1).T).T / 254
    assert ((y - x @ w.T).abs() <= bound * 1.01 + 1e-6).all()


def test_bad_shapes_are_clear_errors():
    raw = torch.from_numpy(random_blocks(4, 2, "Q8_0", 0))
    with pytest.raises(ValueError, match="x has 48 features"):
        cpu_quantized_matmul_int8.quantized_matmul(torch.zeros(1, 48), raw, "Q8_0")
    with pytest.raises(ValueError, match="qtype must be one of"):
        cpu_quantized_matmul_int8.quantized_matmul(torch.zeros(1, 64), raw, "Q2_K")
