"""The float32 C quantized matmul (kernels/cpu_quantized_matmul_fp32.{py,c}): W's blocks decoded
to float32, float32 FMAs, x as it is.

Its decoded weights are `gguf`'s dequantization bit for bit (random bytes, every type), so the
only difference from the exact product is the order of the float32 sums. The kernel sums each
output in 8 lanes (lane l takes k = l, l + 8, ...: K / 8 products, one rounding each as an FMA
or two as a product and a sum), then adds the lanes in a tree of 3 levels; so each product
passes through at most n = K / 8 + 4 roundings and (Higham's bound for a sum in any order)

    |y - x.w| <= gamma_n sum_j |x_j w_j|,    gamma_n = n u / (1 - n u),  u = 2^-24,

against x.w computed exactly (float64 holds a product of two float32 exactly; its own sum's
error is a K 2^-53 share, far below). The reference, `F.linear` on the dequantized weight, sums
in an order of its own (any order: gamma_K), so |y - reference| <= (gamma_n + gamma_K) sum |x w|.
Shapes: rows 1 to 70 (the 3-row micro-kernel and its 1- and 2-row remainders), output features
not multiples of the kernel's 4 or its panel of 8, 1 to 3 threads; the same checks on the plain
C build of the file (no AVX), and the CPU backend's choice where the build fails.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_gguf import random_blocks

from nanovllm.backends import cpu_quantized
from nanovllm.kernels import cpu_quantized_matmul_fp32
from nanovllm.models.gguf_quants import FORMATS, KEPT_TYPES, QuantizedTensor
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.quantized_linear import dequantize_linear

gguf = pytest.importorskip("gguf")
if cpu_quantized_matmul_fp32.load() is None:
    pytest.skip("no C compiler: the float32 kernel is not built", allow_module_level=True)

U = 2.0**-24


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def weight_blocks(qtype: str, rows: int, blocks: int, seed: int) -> np.ndarray:
    """A weight's blocks: `gguf`'s quantization of normal values where it has one (Q8_0, Q4_0,
    Q4_1), random quants with finite scales for the K-quants (which `gguf` cannot quantize to)."""
    if qtype.endswith("_K"):
        return random_blocks(rows, blocks, qtype, seed)
    weight = np.random.default_rng(seed).standard_normal((rows, 32 * blocks)).astype(np.float32)
    return gguf.quants.quantize(weight, gguf.GGMLQuantizationType[qtype])


def check_product(qtype: str, rows: int, out_features: int, blocks: int, seed: int, lib=None):
    columns = FORMATS[qtype].block_size * blocks
    raw = weight_blocks(qtype, out_features, blocks, seed)
    x = torch.from_numpy(
        np.random.default_rng(seed + 1).standard_normal((rows, columns)).astype(np.float32)
    )
    y = cpu_quantized_matmul_fp32.quantized_matmul(x, torch.from_numpy(raw), qtype, lib)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).astype(np.float64)
    x64 = x.numpy().astype(np.float64)
    exact, magnitude = x64 @ theirs.T, np.abs(x64) @ np.abs(theirs).T  # [rows, out]
    reference = dequantize_linear(x, QuantizedTensor(raw, qtype, columns), None).numpy()
    assert y.shape == (rows, out_features) and y.dtype == torch.float32
    ours = gamma(columns // 8 + 4) * magnitude
    assert (np.abs(y.numpy() - exact) <= ours).all()
    assert (np.abs(y.numpy() - reference) <= ours + gamma(columns) * magnitude).all()


@settings(max_examples=examples(40), deadline=None)
@given(
    qtype=st.sampled_from(KEPT_TYPES),
    rows=st.integers(1, 70),
    out_features=st.integers(1, 40),
    blocks=st.integers(1, 3),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_fp32_matmul_is_the_exact_product_to_float32_rounding(
    qtype, rows, out_features, blocks, threads, seed
):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # (the kernel takes torch's thread count)
    try:
        check_product(qtype, rows, out_features, blocks, seed)
    finally:
        torch.set_num_threads(before)


@settings(max_examples=examples(30), deadline=None)
@given(
    qtype=st.sampled_from(KEPT_TYPES),
    out_features=st.integers(1, 9),
    blocks=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_fp32_dequantize_is_gguf_bit_for_bit(qtype, out_features, blocks, seed):
    """Random bytes: every scale a float16 bit pattern (subnormals, infinities, NaNs)."""
    generator = np.random.default_rng(seed)
    raw = generator.integers(0, 256, (out_features, blocks * FORMATS[qtype].block_bytes), np.uint8)
    ours = cpu_quantized_matmul_fp32.dequantize(torch.from_numpy(raw), qtype).numpy()
    with np.errstate(invalid="ignore", over="ignore"):  # (infinite or NaN scales, on purpose)
        theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs)  # (NaNs in the same places)
    assert np.array_equal(np.signbit(ours), np.signbit(theirs))  # (-0.0 too)


@pytest.fixture(scope="module")
def plain_c():
    """The same file built without AVX (so without AVX2, FMA and F16C): its plain C loops."""
    lib = cpu_quantized_matmul_fp32.build(["-mno-avx"])
    assert lib.has_avx2() == 0
    return lib


@settings(max_examples=examples(15), deadline=None)
@given(
    qtype=st.sampled_from(KEPT_TYPES),
    rows=st.integers(1, 8),
    out_features=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_the_plain_c_build_computes_the_same(plain_c, qtype, rows, out_features, seed):
    check_product(qtype, rows, out_features, 1, seed, plain_c)
    raw = np.random.default_rng(seed).integers(
        0, 256, (out_features, FORMATS[qtype].block_bytes), np.uint8
    )
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).astype(np.float32)
    ours = cpu_quantized_matmul_fp32.dequantize(torch.from_numpy(raw), qtype, plain_c).numpy()
    np.testing.assert_array_equal(ours, theirs)  # (its float16 decoding by hand: subnormals too)


def test_bad_shapes_are_clear_errors():
    raw = torch.from_numpy(random_blocks(4, 2, "Q8_0", 0))
    with pytest.raises(ValueError, match="x has 48 features"):
        cpu_quantized_matmul_fp32.quantized_matmul(torch.zeros(1, 48), raw, "Q8_0")
    with pytest.raises(ValueError, match="qtype must be one of"):
        cpu_quantized_matmul_fp32.quantized_matmul(torch.zeros(1, 64), raw, "Q2_K")


def test_where_the_build_fails_the_backend_keeps_numba_with_one_notice(
    monkeypatch, tmp_path, caplog
):
    """A compiler that fails (`CC=false`, nothing cached): `load()` is None after one notice, and
    the CPU backend's layers are the numba ones; with the library, the C ones."""
    assert cpu_quantized.exact_quantized_classes() is cpu_quantized.C_QUANTIZED_CLASSES
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("NANOVLLM_CACHE_DIR", str(tmp_path))
    cpu_quantized_matmul_fp32.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="nanovllm.kernels"):
            assert cpu_quantized_matmul_fp32.load() is None
            layers = cpu_quantized.cpu_quantized_layers(ModelLayers(), enforce_eager=True)
            assert not cpu_quantized_matmul_fp32.applies(torch.zeros(1, 32), "Q8_0")
        notices = [r.getMessage() for r in caplog.records]
        assert len(notices) == 1 and "could not be built" in notices[0], notices
        assert layers.qkv is cpu_quantized.NumbaQuantizedQKVParallelLinear
        assert layers.lm_head is cpu_quantized.NumbaQuantizedParallelLMHead
        assert cpu_quantized.quantized_kernel_name() == "numba kernel"
    finally:
        monkeypatch.undo()
        cpu_quantized_matmul_fp32.load.cache_clear()
    layers = cpu_quantized.cpu_quantized_layers(ModelLayers(), enforce_eager=True)
    assert layers.row is cpu_quantized.CQuantizedRowParallelLinear


def test_no_input_features_give_zeros():
    """An empty sum is 0 (the assembly loop itself runs at least once, so the C file checks)."""
    y = cpu_quantized_matmul_fp32.quantized_matmul(
        torch.zeros(2, 0), torch.zeros(5, 0, dtype=torch.uint8), "Q8_0"
    )
    assert torch.equal(y, torch.zeros(2, 5))
