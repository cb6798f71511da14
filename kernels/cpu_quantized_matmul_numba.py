"""y = x W^T with W in llama.cpp's Q8_0, Q4_0 or Q4_1 blocks, compiled by numba: the blocks read as stored.

What they compute is `models/quantized_linear.py`'s `dequantize_linear` without its bias
(dequantize W to float32, then `F.linear`), which is their reference:

    for each output feature n:
        w[0..K) = row n of W dequantized, block by block, as gguf_quants.py's formulas
        y[m, n] = sum_j x[m, j] * w[j]                 for every row m of x

Why: a decode step's x has a few rows, so the matmul is bound by reading W. The reference
writes a float32 copy of W and reads it back (4 bytes a weight, twice); here each row's
8.5 (Q8_0) or 4.5 (Q4_0) bits a weight are read from memory once, turned into floats in the
core's cache, and used by every row of x before the next row is read.

How work maps: `prange` over chunks of `CHUNK` output features (one thread each); four features
at a time, their rows of W are decoded block by block into a float32 scratch of the thread's
(4 x K floats, in the core's L1 cache), then dotted with the rows of x four at a time (16 sums
in one loop, so each element of x and w loaded serves four products; a 32-row product of the
LM head's shape ran 1.6x slower with one sum per loop, and 1.3x slower with eight). The block length is passed
as an argument: with a constant 32, LLVM unrolls the loops fully and then does not vectorise
them (seen in the assembly); with a runtime length it vectorises both the decoding and the dot
products. The float16 scale is decoded from its two bytes by hand (`_half`), exactly as numpy's conversion.
The dot products sum in another order than `F.linear`, so they agree with it to rounding, not
bit for bit (tests/kernels/test_kernel_quantized_matmul.py). float32 only, contiguous arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
CHUNK = 16  # output features per thread's turn


# 2^(e - 25) for a float16 exponent field e: a normal float16 is (1024 + mantissa) * 2^(e - 25).
# (A table, not `math.ldexp`: a libm call per block cost more than decoding its 32 weights.)
_POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float32)


@njit(cache=True, inline="always")
def _half(lo, hi):  # two bytes of an IEEE float16, little-endian -> its value as float32
    bits = np.int32(lo) | (np.int32(hi) << 8)
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    if exponent == 0:  # zero or subnormal: mantissa * 2^-24
        value = np.float32(mantissa) * np.float32(2.0**-24)
    elif exponent == 31:
        value = np.float32(np.inf) if mantissa == 0 else np.float32(np.nan)
    else:
        value = np.float32(1024 + mantissa) * _POW2[exponent]
    return -value if bits & 0x8000 else value


@njit(cache=True, inline="always")
def _decode_row(w, raw, qs, n, qtype, block):  # row n's weights into w[0..K) (float32)
    half = block // 2
    for b in range(w.shape[0] // block):
        first = b * block
        if qtype == 0:  # Q8_0: d, 32 int8
            o = b * (block + 2)
            d = _half(raw[n, o], raw[n, o + 1])
            for j in range(block):
                w[first + j] = np.float32(qs[n, o + 2 + j]) * d
        elif qtype == 1:  # Q4_0: d, 16 bytes of nibbles; (q - 8) * d
            o = b * (half + 2)
            d = _half(raw[n, o], raw[n, o + 1])
            for j in range(half):
                byte = raw[n, o + 2 + j]
                w[first + j] = d * np.float32(np.int32(byte & 0x0F) - 8)
                w[first + half + j] = d * np.float32(np.int32(byte >> 4) - 8)
        else:  # Q4_1: d, m, 16 bytes of nibbles; q * d + m
            o = b * (half + 4)
            d = _half(raw[n, o], raw[n, o + 1])
            m = _half(raw[n, o + 2], raw[n, o + 3])
            for j in range(half):
                byte = raw[n, o + 4 + j]
                w[first + j] = d * np.float32(byte & 0x0F) + m
                w[first + half + j] = d * np.float32(byte >> 4) + m


@njit(cache=True, inline="always")
def _dot_rows(out, x, w, n, width):  # out[:, n : n + width] = x @ w[:width]^T (w: 4 rows)
    num_rows, k = x.shape
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    m = 0
    while m + 4 <= num_rows:  # four rows of x by four of W: 16 sums, each x and w read once
        x0, x1, x2, x3 = x[m], x[m + 1], x[m + 2], x[m + 3]
        a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
        a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
        for j in range(k):
            u0, u1, u2, u3 = w0[j], w1[j], w2[j], w3[j]
            v = x0[j]
            a00 += v * u0
            a01 += v * u1
            a02 += v * u2
            a03 += v * u3
            v = x1[j]
            a10 += v * u0
            a11 += v * u1
            a12 += v * u2
            a13 += v * u3
            v = x2[j]
            a20 += v * u0
            a21 += v * u1
            a22 += v * u2
            a23 += v * u3
            v = x3[j]
            a30 += v * u0
            a31 += v * u1
            a32 += v * u2
            a33 += v * u3
        sums = (
            (a00, a01, a02, a03),
            (a10, a11, a12, a13),
            (a20, a21, a22, a23),
            (a30, a31, a32, a33),
        )
        for r in range(4):
            for c in range(width):
                out[m + r, n + c] = sums[r][c]
        m += 4
    for r in range(m, num_rows):
        b0 = b1 = b2 = b3 = np.float32(0.0)
        for j in range(k):
            v = x[r, j]
            b0 += v * w0[j]
            b1 += v * w1[j]
            b2 += v * w2[j]
            b3 += v * w3[j]
        rest = (b0, b1, b2, b3)
        for c in range(width):
            out[r, n + c] = rest[c]


@njit(cache=True, parallel=True, fastmath=_FASTMATH, nogil=True)
def quantized_matmul(
    out,  # [M, N] float32, written
    x,  # [M, K] float32
    raw,  # [N, K / 32 * block_bytes] uint8: the blocks
    qs,  # the same bytes as int8 (Q8_0's quants are signed)
    qtype,  # 0: Q8_0, 1: Q4_0, 2: Q4_1
    block,  # 32 (an argument, not a constant: see the module docstring)
):
    k = x.shape[1]
    n_out = raw.shape[0]
    for chunk in prange((n_out + CHUNK - 1) // CHUNK):
        w = np.zeros((4, k), np.float32)  # four rows of W, dequantized (in the core's L1 cache)
        end = min(n_out, (chunk + 1) * CHUNK)
        for n in range(chunk * CHUNK, end, 4):
            width = min(4, end - n)
            for i in range(width):
                _decode_row(w[i], raw, qs, n + i, qtype, block)
            _dot_rows(out, x, w, n, width)
