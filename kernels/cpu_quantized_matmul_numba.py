"""y = x W^T with W in llama.cpp's Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K blocks, compiled by numba: the blocks read as stored.

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
LM head's shape ran 1.6x slower with one sum per loop, and 1.3x slower with eight). So each
weight is decoded once per call, whatever the rows of x. The block length is passed
as an argument: with a constant 32, LLVM unrolls the loops fully and then does not vectorise
them (seen in the assembly); with a runtime length it vectorises both the decoding and the dot
products.

Decoding a block costs little only if its loop is vectorised and its scale is cheap, since a
row of 576 weights is only 18 blocks. Two things made the decoding 2-3x faster (a one-row
product of the LM head's shape, kernels/README.md): indices are unsigned (numba adds a
wraparound test to a signed index it cannot prove non-negative, such as `first + j`, which
kept LLVM from loading the block as one vector), and a float16 scale is one load from
`FLOAT16`, a table of all 65,536 float16 values as float32 made by numpy's exact conversion
(decoding its bits by hand, with branches for subnormals, cost more than the block's 32
weights). The dot products sum in another order than `F.linear`, so they agree with it to
rounding, not bit for bit (tests/kernels/test_kernel_quantized_matmul.py). float32 only,
contiguous arrays.

`dequantize` decodes a whole weight with the same row decoder, for a matmul with many rows of x
(a prefill), which is bound by arithmetic and goes to MKL's float32 kernels instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
CHUNK = 16  # output features per thread's turn


# float16 bits -> value, float32: every float16, converted by numpy (exactly)
FLOAT16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

_U = np.uint64  # (unsigned indices: see the module docstring)


@njit(cache=True, inline="always")
def _scale(row, o, f16):  # the float16 at bytes o, o + 1 of a row, as float32
    return f16[np.int64(row[o]) | (np.int64(row[o + _U(1)]) << 8)]


@njit(cache=True, inline="always")
def _decode_row(w, raw, qs, n, qtype, block, f16):  # row n's weights into w[0..K) (float32)
    row, qrow = raw[n], qs[n]
    block = _U(block)
    half = block // _U(2)
    if qtype >= 3:
        _decode_row_k(w, row, qrow, qtype, block, f16)
        return
    for b in range(_U(w.shape[0]) // block):
        first = b * block
        if qtype == 0:  # Q8_0: d, 32 int8
            o = b * (block + _U(2))
            d = _scale(row, o, f16)
            o += _U(2)
            for j in range(block):
                w[first + j] = np.float32(qrow[o + j]) * d
        elif qtype == 1:  # Q4_0: d, 16 bytes of nibbles; (q - 8) * d
            o = b * (half + _U(2))
            d = _scale(row, o, f16)
            o += _U(2)
            for j in range(half):
                byte = np.int32(row[o + j])
                w[first + j] = d * np.float32((byte & 0x0F) - 8)
                w[first + half + j] = d * np.float32((byte >> 4) - 8)
        else:  # Q4_1: d, m, 16 bytes of nibbles; q * d + m
            o = b * (half + _U(4))
            d = _scale(row, o, f16)
            m = _scale(row, o + _U(2), f16)
            o += _U(4)
            for j in range(half):
                byte = np.int32(row[o + j])
                w[first + j] = d * np.float32(byte & 0x0F) + m
                w[first + half + j] = d * np.float32(byte >> 4) + m


@njit(cache=True, fastmath=_FASTMATH)  # (not inlined: the K-quants compile once, for both kernels)
def _decode_row_k(w, row, qrow, qtype, sub, f16):  # the K-quants' super-blocks of 256 weights
    # (layouts: gguf_quants.py's `_dequantize_k`; `sub` is 32, a sub-block's length, passed at
    # run time so that LLVM vectorises the loops over it)
    nbytes = _U(144 if qtype == 3 else 176 if qtype == 4 else 210)
    for b in range(_U(w.shape[0]) // _U(256)):
        first = b * _U(256)
        o = b * nbytes
        if qtype == 5:  # Q6_K: ql 128, qh 64, 16 int8 scales, d; d sc (q - 32), sub-blocks of 16
            d = _scale(row, o + _U(208), f16)
            for h in range(_U(2)):  # each half of 128 weights: ql 64 bytes, qh 32
                ql, qh = o + h * _U(64), o + _U(128) + h * _U(32)
                for g in range(_U(4)):  # 32 weights: ql's low (g < 2) or high nibbles, qh's bits 2g
                    start = first + h * _U(128) + g * _U(32)
                    lo = ql + (g & _U(1)) * _U(32)
                    shift = np.int32(g >> _U(1)) * 4
                    s0 = d * np.float32(qrow[o + _U(192) + (start - first) // _U(16)])
                    s1 = d * np.float32(qrow[o + _U(193) + (start - first) // _U(16)])
                    for j in range(sub):
                        q = ((np.int32(row[lo + j]) >> shift) & 0x0F) | (
                            ((np.int32(row[qh + j]) >> (2 * np.int32(g))) & 0x03) << 4
                        )
                        w[start + j] = (s0 if j < _U(16) else s1) * np.float32(q - 32)
        else:  # Q4_K, Q5_K: d, dmin, 12 bytes of 6-bit scales and minimums, (qh 32), qs 128
            d, dmin = _scale(row, o, f16), _scale(row, o + _U(2), f16)
            s = o + _U(4)
            qs = o + _U(16 if qtype == 3 else 48)
            for i in range(_U(8)):  # sub-block i: low (i even) or high nibbles of qs[32 (i // 2)..]
                if i < _U(4):
                    sc = np.int32(row[s + i]) & 63
                    mn = np.int32(row[s + i + _U(4)]) & 63
                else:
                    sc = (np.int32(row[s + i + _U(4)]) & 0x0F) | (
                        (np.int32(row[s + i - _U(4)]) >> 2) & 0x30
                    )
                    mn = (np.int32(row[s + i + _U(4)]) >> 4) | ((np.int32(row[s + i]) >> 2) & 0x30)
                scale, minimum = d * np.float32(sc), dmin * np.float32(mn)
                src = qs + (i >> _U(1)) * _U(32)
                shift = np.int32(i & _U(1)) * 4
                start = first + i * _U(32)
                for j in range(sub):
                    q = (np.int32(row[src + j]) >> shift) & 0x0F
                    if qtype == 4:  # the fifth bit: bit i of qh[j]
                        q |= ((np.int32(row[o + _U(16) + j]) >> np.int32(i)) & 1) << 4
                    w[start + j] = scale * np.float32(q) - minimum


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
    qtype,  # 0..5: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K (the wrapper's QTYPES)
    block,  # 32 (an argument, not a constant: see the module docstring)
    f16,  # FLOAT16
):
    k = x.shape[1]
    n_out = raw.shape[0]
    for chunk in prange((n_out + CHUNK - 1) // CHUNK):
        w = np.zeros((4, k), np.float32)  # four rows of W, dequantized (in the core's L1 cache)
        end = min(n_out, (chunk + 1) * CHUNK)
        for n in range(chunk * CHUNK, end, 4):
            width = min(4, end - n)
            for i in range(width):
                _decode_row(w[i], raw, qs, n + i, qtype, block, f16)
            _dot_rows(out, x, w, n, width)


@njit(cache=True, parallel=True, fastmath=_FASTMATH, nogil=True)
def dequantize(
    out,  # [N, K] float32, written: W's values
    raw,  # [N, K / block_size * block_bytes] uint8
    qs,  # the same bytes as int8
    qtype,  # 0..5: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K (the wrapper's QTYPES)
    block,  # 32
    f16,  # FLOAT16
):
    for n in prange(raw.shape[0]):
        _decode_row(out[n], raw, qs, n, qtype, block, f16)
