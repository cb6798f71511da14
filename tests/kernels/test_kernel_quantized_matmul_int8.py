"""The int8 quantized matmul (kernels/cpu_quantized_matmul_int8*.{py,c}): x rounded to int8 blocks,
integer dot products. Against its oracle in plain torch (`quantized_matmul_ref`: the same
rounding of x, then x W^T with W dequantized by models/gguf_quants.py, which is `gguf`'s own
dequantization bit for bit), to float rounding; and against the unrounded product, within
the bound that x's rounding allows. Both the library this CPU gets (VNNI, AVX2 or plain loops)
and the plain loops built on purpose (`-mno-avx2`), so that the plain path stays tested."""

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
# the plain C loops, whatever the CPU ("-mno-avx2" also turns off AVX-512, which needs it)
PLAIN = ("-mno-avx2",) if cpu_quantized_matmul_int8.instruction_set() != "plain C loops" else ()


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(KEPT_TYPES),
    rows=st.integers(1, 20),
    out_features=st.integers(1, 20),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    plain=st.booleans(),
)
def test_int8_matmul_matches_its_oracle_and_gguf(qtype, rows, out_features, blocks, seed, plain):
    columns = FORMATS[qtype].block_size * blocks
    raw = random_blocks(out_features, blocks, qtype, seed)
    x = torch.from_numpy(
        np.random.default_rng(seed + 1).standard_normal((rows, columns)).astype(np.float32)
    )
    assert cpu_quantized_matmul_int8.applies(x, qtype)
    lib = cpu_quantized_matmul_int8.load_variant(PLAIN if plain else ())
    y = cpu_quantized_matmul_int8.quantized_matmul(x, torch.from_numpy(raw), qtype, lib)
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


def test_the_cpu_gets_its_fastest_sums():
    """-march=native compiles the VNNI sums where the CPU lists avx512_vnni, else AVX2's where it
    lists avx2 (and fma, f16c), else the plain loops; the variant asked for is the plain one."""
    flags = cpu_quantized_matmul_int8._cpu_flags().split()
    expected = (
        "AVX-512 VNNI"
        if {"avx512_vnni", "avx512bw"} <= set(flags)
        else "AVX2"
        if {"avx2", "fma", "f16c"} <= set(flags)
        else "plain C loops"
    )
    assert cpu_quantized_matmul_int8.instruction_set() == expected
    plain = cpu_quantized_matmul_int8.load_variant(PLAIN)
    assert cpu_quantized_matmul_int8.instruction_set(plain) == "plain C loops"


def test_extreme_blocks_sum_exactly():
    """Q8_0 quants of -128 and 127 times x at +-127 (its block's largest |x|): the AVX2 pairs'
    largest int16 (2 * 128 * 127), summed without saturating, as the plain loops sum them."""
    blocks = 4
    raw = np.zeros((3, blocks, 34), np.uint8)
    raw[:, :, :2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)  # d = 0.5
    raw[0, :, 2:] = np.uint8(128)  # q = -128
    raw[1, :, 2:] = 127
    raw[2, :, 2::2], raw[2, :, 3::2] = np.uint8(128), 127
    raw = torch.from_numpy(raw.reshape(3, -1))
    x = torch.tensor([[1.0, -1.0] * 16 * blocks, [-1.0] * 32 * blocks])  # qx = +-127
    w = dequantize(raw, "Q8_0")
    oracle = cpu_quantized_matmul_int8.quantized_matmul_ref(x, w)
    for flags in ((), PLAIN):
        lib = cpu_quantized_matmul_int8.load_variant(flags)
        y = cpu_quantized_matmul_int8.quantized_matmul(x, raw, "Q8_0", lib)
        assert torch.equal(y, oracle), (flags, y, oracle)


@pytest.mark.skipif(cpu_quantized_matmul_int8.load() is None, reason="no C compiler here")
def test_the_oracle_rounds_halves_away_from_zero_as_the_kernel_does():
    """Ties: x / dx exactly k + 1/2 (dx = 1 where the block's largest magnitude is 127). The
    kernel's C roundf, as llama.cpp's, takes them away from zero (2.5 -> 3, -0.5 -> -1), where
    torch.round would take them to even; random float32 rows hit such a value about once in
    10^5, so a 100-row batch often has one. The oracle must round as the kernel does, bit for bit,
    on ties and on random rows alike."""
    halves = torch.tensor([127.0, -126.5, 2.5, -2.5, 0.5, -0.5, 1.5, 3.49999976] * 4)
    x = torch.cat([halves.reshape(1, 32), torch.randn(3, 32) * 4.0])
    qx, dx = cpu_quantized_matmul_int8.quantize_rows_ref(x)
    assert qx[0, 0, :8].tolist() == [127.0, -127.0, 3.0, -3.0, 1.0, -1.0, 2.0, 3.0]
    xu, dx8, sx = torch.empty(4, 32, dtype=torch.uint8), torch.empty(4, 8), torch.empty(4, 1)
    cpu_quantized_matmul_int8.load().quantize_rows_q8(
        x.data_ptr(), 4, 32, xu.data_ptr(), dx8.data_ptr(), sx.data_ptr()
    )
    assert torch.equal(qx.reshape(4, 32), xu.float() - 128.0)
    assert torch.equal(dx.reshape(4), dx8[:, 0])
