"""Lesson 18 exercise: the Q8_0 block format, llama.cpp's 8-bit weights.

A decode step reads every weight of the model once, so its time is bounded below by the
weights' bytes over the memory's bandwidth. Q8_0 stores each weight in 8.5 bits instead of
float32's 32: a row of `in` weights is cut into blocks of 32, and each block is stored as

    bytes 0-1    d, one float16 scale (little-endian): the block's largest |x| / 127
    bytes 2-33   q_0 .. q_31, int8: x_j / d rounded to the nearest integer, -127 .. 127

so weight j is q_j * d, up to half a step of d. You write the three things a runtime does with
such blocks: make them (`quantize_q8_0`, what a converter does once), read them back
(`dequantize_q8_0`), and multiply by them one block at a time (`matmul_q8_0`, what every
decode step does). Check with `nanovllm lesson 18 --check`; your bytes are compared with the
`gguf` package's (llama.cpp's own Python), bit for bit.
"""

from __future__ import annotations

import torch


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """The Q8_0 blocks of x, exactly as llama.cpp writes them.

    x float32 [rows, in], finite, with `in` a multiple of 32 (else raise ValueError naming the
    shape). For each block of 32 consecutive values of a row, in float32:

        d    = max |x_j| / 127
        q_j  = round(x_j * (1 / d))     (0 for every j when d == 0)

    `round` is C's `roundf`: half away from zero (2.5 -> 3, -2.5 -> -3), not Python's or torch's
    half to even. Multiply by the inverse `1 / d` as llama.cpp does, not divide by d (the two
    differ in the last bit). d is stored as float16, rounded from the float32 d *after* the q_j
    are computed with the float32 one.

    Returns uint8 [rows, in / 32 * 34]: the row's blocks one after another, each the 2 bytes of
    d as a float16 (`d.to(torch.float16).view(torch.uint8)` gives them in the right order), then
    its 32 q_j as int8 bytes (`.view(torch.uint8)`). Do not modify x.
    """
    raise NotImplementedError("write quantize_q8_0 (lesson 18)")


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """The float32 weights of Q8_0 blocks.

    raw uint8 [rows, in / 32 * 34] (any bytes: any finite float16 scale, any int8, -128 too).
    Returns float32 [rows, in]: weight j of a block is q_j * d, with d the block's float16
    scale and q_j its int8 values, multiplied in float32. Do not modify raw.
    """
    raise NotImplementedError("write dequantize_q8_0 (lesson 18)")


def matmul_q8_0(x: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """y = x W^T with W [out, in] in Q8_0 blocks, one block at a time.

    x float32 [num_tokens, in]; raw uint8 [out, in / 32 * 34] (W's rows, as `quantize_q8_0`
    returns them). Returns float32 [num_tokens, out]:

        y[t, n] = sum over blocks b of  d[n, b] * (sum over j < 32 of x[t, 32 b + j] * q[n, b, j])

    W's blocks hold integers and one scale each, so the scale comes out of the block's sum: 32
    multiply-adds with the q_j, then one multiplication by d. Sum in float32. Do not modify the
    inputs.
    """
    raise NotImplementedError("write matmul_q8_0 (lesson 18)")
