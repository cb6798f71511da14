"""Lesson 18 properties: Q8_0 blocks, byte for byte as llama.cpp writes and reads them.

Each property takes the implementation as `impl` and checks it against oracles written here,
independently of the engine: the `gguf` package's own `quantize` and `dequantize` (llama.cpp's
Python, when it is installed), and a transcription of llama.cpp's C (`quantize_row_q8_0_ref`)
in float64 arithmetic where that is exact: Python's `struct` for the float16 scale, and
`floor(|v| + 0.5)` in float64 for `roundf` (exact for a float32 below 2^24). Besides the bytes:
the round trip within half a step of each block's scale (plus the scale's own float16
rounding), each block's largest value at +-127, and the product against float64 within the
bound of float32 summation.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.lessons.strategies import seeds
from nanovllm.lessons.testing import lesson_settings, returned, show_inputs

BLOCK = 32  # weights per block
BLOCK_BYTES = 34  # a float16 scale and 32 int8
_BELOW_HALF = float(np.nextafter(np.float32(0.5), np.float32(0)))  # 0.49999997


class Weights(NamedTuple):
    """x float32 [rows, blocks * 32], made from `seed`: normal values times `scale` ("random"),
    the last block of every row zero ("zero-block"), half-integers with each block's largest
    at +-127 times a power of two, so each block's d is that power exactly and every tie is
    exact ("ties"), a few large values among small ones ("outlier"), or mostly zeros ("sparse")."""

    rows: int
    blocks: int
    kind: str
    scale: float
    seed: int

    def tensor(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed)
        n = self.blocks * BLOCK
        x = torch.randn(self.rows, n, generator=gen) * self.scale
        if self.kind == "zero-block":
            x[:, n - BLOCK :] = 0
        elif self.kind == "ties":
            steps = torch.randint(-126, 126, (self.rows, n), generator=gen).float() + 0.5
            edges = torch.tensor([_BELOW_HALF, -_BELOW_HALF, 0.5, -0.5, 1.5, -2.5, 0.0])
            steps[:, : len(edges)] = edges
            steps = steps.reshape(self.rows, self.blocks, BLOCK)
            steps[:, :, -1] = torch.where(torch.rand(self.rows, self.blocks, generator=gen) < 0.5,
                                          127.0, -127.0)  # fmt: skip
            power = 2.0 ** round(float(np.log2(self.scale)))
            x = steps.reshape(self.rows, n) * power
        elif self.kind == "outlier":
            where = torch.randint(0, n, (self.rows,), generator=gen)
            x[torch.arange(self.rows), where] *= 1000
        elif self.kind == "sparse":
            x[torch.rand(self.rows, n, generator=gen) < 0.9] = 0
        return x


@st.composite
def weights(draw, max_rows: int = 4, max_blocks: int = 4) -> Weights:
    return Weights(
        draw(st.integers(1, max_rows), label="rows"),
        draw(st.integers(1, max_blocks), label="blocks"),
        draw(
            st.sampled_from(["random", "random", "zero-block", "ties", "outlier", "sparse"]),
            label="kind",
        ),  # fmt: skip
        draw(st.sampled_from([1e-6, 1e-3, 0.25, 1.0, 30.0]), label="scale"),
        draw(seeds, label="seed"),
    )


class Blocks(NamedTuple):
    """Random Q8_0 bytes [rows, blocks * 34]: every scale a finite float16 (subnormals too),
    every q any int8, -128 included (a quantizer never writes it; a file may hold it). With
    `tame`, the scales are normal float16 between 2^-10 and 2^4."""

    rows: int
    blocks: int
    tame: bool
    seed: int

    def tensor(self) -> torch.Tensor:
        rng = np.random.default_rng(self.seed)
        if self.tame:
            d = (2.0 ** rng.uniform(-10, 4, (self.rows, self.blocks, 1))).astype(np.float16)
        else:
            bits = rng.integers(0, 2**16, (self.rows, self.blocks, 1), dtype=np.uint16)
            bits[((bits >> 10) & 0x1F) == 0x1F] &= 0xFBFF  # no inf or NaN: exponent 31 -> 30
            d = bits.view(np.float16)
        q = rng.integers(-128, 128, (self.rows, self.blocks, BLOCK), dtype=np.int8)
        raw = np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=-1)
        return torch.from_numpy(raw.reshape(self.rows, -1).copy())


@st.composite
def blocks(draw, tame: bool | None = None) -> Blocks:
    return Blocks(
        draw(st.integers(1, 4), label="rows"),
        draw(st.integers(1, 4), label="blocks"),
        draw(st.booleans(), label="tame") if tame is None else tame,
        draw(seeds, label="seed"),
    )


# --- the oracles --------------------------------------------------------------------------------


def _c_reference(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_q8_0_ref, transcribed: x float32 [rows, in] -> uint8 blocks."""
    rows = x.shape[0]
    blocks = x.reshape(rows, -1, BLOCK).astype(np.float32)
    out = np.zeros((*blocks.shape[:2], BLOCK_BYTES), np.uint8)
    for r in range(rows):
        for b in range(blocks.shape[1]):
            values = blocks[r, b]
            d = np.float32(np.abs(values).max()) / np.float32(127)  # float32 division
            inverse = np.float32(1) / d if d else np.float32(0)
            scaled = (values * inverse).astype(np.float64)  # float32 products, held exactly
            q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)  # roundf, exact in float64
            out[r, b, :2] = np.frombuffer(struct.pack("<e", float(d)), np.uint8)
            out[r, b, 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(rows, -1)


def _gguf():
    try:
        import gguf
    except ImportError:  # (the `gguf` extra: pip install "nanovllm[gguf]")
        return None
    return gguf


def _scales_and_q(raw: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each block's scale, float64 [rows, blocks] (read by `struct`), and q int64 [rows, blocks,
    32]."""
    b = raw.numpy().reshape(raw.shape[0], -1, BLOCK_BYTES)
    d = np.array(
        [[struct.unpack("<e", bytes(block[:2]))[0] for block in row] for row in b], np.float64
    ).reshape(b.shape[:2])
    return d, b[..., 2:].view(np.int8).astype(np.int64)


def _values(raw: torch.Tensor) -> np.ndarray:
    """The weights in float64 [rows, in]: q_j * d, exact (11 bits times 8 fit a float32 too)."""
    d, q = _scales_and_q(raw)
    return (q * d[..., None]).reshape(raw.shape[0], -1)


def _first_block_differing(got: np.ndarray, want: np.ndarray) -> tuple[int, int]:
    bad = np.argwhere(
        got.reshape(got.shape[0], -1, BLOCK_BYTES) != want.reshape(got.shape[0], -1, BLOCK_BYTES)
    )
    return int(bad[0][0]), int(bad[0][1])


def _quantized(impl, x: torch.Tensor) -> torch.Tensor:
    before = x.clone()
    raw = returned("quantize_q8_0 returned", impl.quantize_q8_0(x))
    assert torch.equal(x, before), "quantize_q8_0 modified the x it was given"
    rows, n = x.shape
    want = (rows, n // BLOCK * BLOCK_BYTES)
    assert (
        isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8 and tuple(raw.shape) == want
    ), (
        f"quantize_q8_0 should return a uint8 tensor of shape {want} (rows, in / 32 * 34); got "
        f"{getattr(raw, 'dtype', type(raw).__name__)} {tuple(getattr(raw, 'shape', ()))}"
    )
    return raw


# --- quantize_q8_0 ------------------------------------------------------------------------------


@lesson_settings(40)
@example(case=Weights(2, 2, "ties", 1.0, 1))
@example(case=Weights(3, 2, "zero-block", 1.0, 2))
@example(case=Weights(1, 3, "random", 1e-6, 3))
@example(case=Weights(2, 1, "ties", 0.25, 4))
@example(case=Weights(4, 4, "random", 1.0, 2676))  # x / d and x * (1 / d) round apart
@given(case=weights())
@show_inputs
def test_quantize_writes_llama_cpps_bytes(impl, case):
    """quantize_q8_0's bytes are llama.cpp's, bit for bit: `gguf.quants.quantize` (when gguf is
    installed) and the C reference transcribed, for random, tied, tiny, zero and sparse blocks."""
    x = case.tensor()
    raw = _quantized(impl, x).numpy()
    oracles = [("llama.cpp's quantize_row_q8_0_ref", _c_reference(x.numpy()))]
    gguf = _gguf()
    if gguf is not None:
        theirs = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0)
        oracles.append(("gguf.quants.quantize", theirs))
    for name, want in oracles:
        if np.array_equal(raw, want):
            continue
        r, b = _first_block_differing(raw, want)
        block = x[r, b * BLOCK : (b + 1) * BLOCK].tolist()
        got_block = raw.reshape(x.shape[0], -1, BLOCK_BYTES)[r, b]
        want_block = want.reshape(x.shape[0], -1, BLOCK_BYTES)[r, b]
        raise AssertionError(
            f"row {r}, block {b} (values {[float(f'{v:.6g}') for v in block]}): {name} writes "
            f"d = {want_block[:2].view(np.float16)[0]!r} (bytes {want_block[:2].tolist()}), q = "
            f"{want_block[2:].view(np.int8).tolist()}; got d = "
            f"{got_block[:2].view(np.float16)[0]!r} (bytes {got_block[:2].tolist()}), q = "
            f"{got_block[2:].view(np.int8).tolist()}"
        )


@lesson_settings(40)
@example(case=Weights(2, 2, "random", 1.0, 5))
@example(case=Weights(2, 3, "zero-block", 30.0, 6))
@example(case=Weights(1, 2, "outlier", 1e-3, 7))
@given(case=weights())
@show_inputs
def test_quantize_round_trips_within_half_a_step(impl, case):
    """Read back (q_j times the stored float16 d, in float64), every value is within half a
    step d / 2 of x_j, plus what rounding d to float16 moved it; each block's largest |x_j| is
    q = +-127 with its sign, and no q_j has the opposite sign of x_j."""
    x = case.tensor()
    raw = _quantized(impl, x)
    d16, q = _scales_and_q(raw)
    xs = x.double().numpy().reshape(*q.shape)  # [rows, blocks, 32]
    d = np.abs(xs).max(axis=-1) / 127  # [rows, blocks]
    bound = d * (0.5 + 1e-4) + 127 * np.abs(d16 - d)
    err = np.abs(q * d16[..., None] - xs)
    for r, b in np.argwhere((~(err <= bound[..., None])).any(axis=-1)):  # (NaN too)
        j = int(err[r, b].argmax())
        raise AssertionError(
            f"row {r}, block {b}: d = max|x| / 127 = {d[r, b]:.6g} (stored {d16[r, b]:.6g}), so "
            f"x = {xs[r, b, j]:.6g} comes back within {bound[r, b]:.3g}; q = {q[r, b, j]} gives "
            f"{q[r, b, j] * d16[r, b]:.6g}"
        )
    for r, b in np.argwhere(d > 0):
        j = int(np.abs(xs[r, b]).argmax())
        want = 127 if xs[r, b, j] > 0 else -127
        assert q[r, b, j] == want, (
            f"row {r}, block {b}: its largest |x| is x_{j} = {xs[r, b, j]:.6g}, which is 127 "
            f"steps of d from 0: q should be {want}; got {q[r, b, j]}"
        )
    wrong = np.argwhere(q * np.sign(xs) < 0)
    assert not len(wrong), (
        f"q_j has the opposite sign of x_j at (row, block, j) {wrong[0].tolist()}: x = "
        f"{xs[tuple(wrong[0])]:.6g}, q = {q[tuple(wrong[0])]}"
    )


@lesson_settings(10)
@example(columns=33)
@given(columns=st.integers(1, 100).filter(lambda n: n % BLOCK))
@show_inputs
def test_quantize_rejects_rows_not_made_of_blocks(impl, columns):
    """A row of x whose length is not a multiple of 32 raises ValueError, naming the shape."""
    x = torch.ones(2, columns)
    try:
        impl.quantize_q8_0(x)
    except ValueError as e:
        assert str(columns) in str(e), f"the error should name the shape (2, {columns}): {e}"
        return
    raise AssertionError(f"quantize_q8_0 of x {tuple(x.shape)} should raise ValueError: {columns} "
                         f"columns are not whole blocks of 32")  # fmt: skip


# --- dequantize_q8_0 ----------------------------------------------------------------------------


@lesson_settings(40)
@example(case=Blocks(2, 2, False, 1))
@example(case=Blocks(1, 3, True, 2))
@given(case=blocks())
@show_inputs
def test_dequantize_is_q_times_d(impl, case):
    """Every weight is its q_j times its block's float16 scale, exactly (`struct`'s float16 and
    float64 arithmetic; `gguf.quants.dequantize` bit for bit too, when gguf is installed), for
    any scale and any int8, -128 included; raw is left as it was."""
    raw = case.tensor()
    before = raw.clone()
    got = returned("dequantize_q8_0 returned", impl.dequantize_q8_0(raw))
    assert torch.equal(raw, before), "dequantize_q8_0 modified the raw bytes it was given"
    want = _values(raw)
    assert (
        isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == want.shape
    ), (
        f"dequantize_q8_0 should return a float32 tensor of shape {want.shape} (rows, in); got "
        f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}"
    )
    gguf = _gguf()
    theirs = (
        None
        if gguf is None
        else gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.Q8_0)
    )
    ours = got.numpy()
    for name, oracle in (("q_j * d", want), ("gguf.quants.dequantize", theirs)):
        if oracle is None or np.array_equal(
            ours.view(np.uint32), oracle.astype(np.float32).view(np.uint32)
        ):
            continue
        r, j = (int(v) for v in np.argwhere(ours != oracle.astype(np.float32))[0])
        d, q = _scales_and_q(raw)
        raise AssertionError(
            f"weight ({r}, {j}) is in block {j // BLOCK}, whose d is {d[r, j // BLOCK]!r} and "
            f"q_{j % BLOCK} = {q[r, j // BLOCK, j % BLOCK]}: {name} gives {oracle[r, j]!r}; got "
            f"{ours[r, j]!r}"
        )


# --- matmul_q8_0 --------------------------------------------------------------------------------


@lesson_settings(40)
@example(case=Blocks(3, 2, True, 1), num_tokens=2, seed=1)
@example(case=Blocks(1, 4, False, 2), num_tokens=1, seed=2)
@given(case=blocks(), num_tokens=st.integers(1, 4), seed=seeds)
@show_inputs
def test_matmul_is_the_float64_product(impl, case, num_tokens, seed):
    """y = x W^T for W's Q8_0 blocks, against the product in float64 of x and W's exact values,
    within float32 summation's rounding (in * 2^-23 of sum |x_j w_j|); inputs left as they
    were."""
    raw = case.tensor()
    n = raw.shape[1] // BLOCK_BYTES * BLOCK
    x = torch.randn(num_tokens, n, generator=torch.Generator().manual_seed(seed))
    given_ = (x.clone(), raw.clone())
    y = returned("matmul_q8_0 returned", impl.matmul_q8_0(x, raw))
    assert torch.equal(x, given_[0]), "matmul_q8_0 modified the x it was given"
    assert torch.equal(raw, given_[1]), "matmul_q8_0 modified the raw bytes it was given"
    shape = (num_tokens, raw.shape[0])
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and tuple(y.shape) == shape, (
        f"matmul_q8_0 should return a float32 tensor of shape {shape} (num_tokens, out); got "
        f"{getattr(y, 'dtype', type(y).__name__)} {tuple(getattr(y, 'shape', ()))}"
    )
    w = _values(raw)  # [out, in] float64
    xs = x.double().numpy()
    want = xs @ w.T
    bound = n * 2.0**-23 * (np.abs(xs) @ np.abs(w).T) + 1e-37
    err = np.abs(y.double().numpy() - want)
    bad = ~(err <= bound)  # (a NaN is bad too)
    if bad.any():
        t, o = (int(v) for v in np.argwhere(bad)[0])
        d, _ = _scales_and_q(raw)
        raise AssertionError(
            f"y[{t}, {o}]: x's row {t} dotted with W's row {o} (its blocks' scales "
            f"{[float(f'{v:.4g}') for v in d[o]]}) is {want[t, o]:.8g} in float64; got "
            f"{float(y[t, o]):.8g}, off by {err[t, o]:.3g} (float32 allows {bound[t, o]:.3g})"
        )
