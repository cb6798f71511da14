"""A dequantizing matmul (Triton): y = x W^T with W read in llama.cpp's Q8_0 or Q4_0 blocks.

Computes what `quantized_matmul_reference.quantized_matmul_ref` computes (the block formats are
described there), without ever writing W out in floating point: program (m, n) owns a
BLOCK_M x BLOCK_N tile of y and walks K one 32-weight block at a time. For each block it loads
the tile's rows of x [BLOCK_M, 32], and, for its BLOCK_N rows of W, the block's two scale bytes
and its quant bytes; it decodes the float16 scale from its bytes (a bitcast), the quants to
float32 (Q8_0: the bytes as int8; Q4_0: byte j % 16, shifted right by 4 for j >= 16, masked,
minus 8), scales them, and accumulates x_block @ w_block^T in float32 (`tl.dot`, IEEE float32
on a GPU, no TF32). Rows and columns past M and N are masked.

Why: a decode step's matmul on a GPU is bound by reading W, so reading 8.5 (Q8_0) or 4.5
(Q4_0) bits a weight instead of 16 makes it up to 2x or 3.5x less memory traffic. Unlike
llama.cpp's CUDA kernels it keeps x in float (no int8 dot products) and it is not tuned; it is
checked on a CPU through Triton's interpreter (tests/kernels/test_kernel_quantized_matmul_triton.py).
The Triton backend's quantized layers call it (`nanovllm/backends/triton_quantized.py`).
"""

from __future__ import annotations

import torch

from nanovllm.kernels import triton_setup
from nanovllm.kernels.quantized_matmul_reference import BLOCK_BYTES, check_quantized_args

triton_setup.configure()  # decides interpreter vs compiled; must run before `import triton`
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def quantized_matmul_kernel(
    x_ptr,  # [M, K] float
    w_ptr,  # [N, row_bytes] uint8: the blocks
    out_ptr,  # [M, N] float32
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    IS_Q8_0: tl.constexpr,  # True: Q8_0 blocks, False: Q4_0
    BLOCK_BYTES: tl.constexpr,  # 34 or 18
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_j = tl.arange(0, 32)  # the weights of one block
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, K // 32):
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + (b * 32 + offs_j)[None, :],
            mask=mask_m[:, None],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_M, 32]
        block = w_ptr + offs_n * stride_wn + b * BLOCK_BYTES  # [BLOCK_N] each block's start
        lo = tl.load(block, mask=mask_n, other=0).to(tl.uint16)
        hi = tl.load(block + 1, mask=mask_n, other=0).to(tl.uint16)
        d = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)  # [BLOCK_N]
        if IS_Q8_0:
            q = tl.load(block[:, None] + 2 + offs_j[None, :], mask=mask_n[:, None], other=0)
            q = q.to(tl.int8, bitcast=True).to(tl.float32)  # [BLOCK_N, 32]
        else:
            byte = tl.load(
                block[:, None] + 2 + (offs_j % 16)[None, :], mask=mask_n[:, None], other=0
            )
            shift = ((offs_j // 16) * 4).to(tl.uint8)[None, :]
            q = ((byte >> shift) & 0x0F).to(tl.int32) - 8
            q = q.to(tl.float32)  # [BLOCK_N, 32]
        w = q * d[:, None]  # [BLOCK_N, 32]: the block's weights, as the reference has them
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(
        out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
        acc,
        mask=mask_m[:, None] & mask_n[None, :],
    )


def quantized_matmul(
    x: torch.Tensor,  # [M, K] float
    raw: torch.Tensor,  # [N, K / 32 * block_bytes] uint8, on x's device
    qtype: str,  # "Q8_0" or "Q4_0"
    block_m: int = 16,
    block_n: int = 32,
) -> torch.Tensor:  # [M, N] float32
    """x @ W^T with W read from its blocks (see the module docstring)."""
    check_quantized_args(x, raw, qtype)
    x = x.contiguous()
    raw = raw.contiguous()
    m, k = x.shape
    n = raw.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    quantized_matmul_kernel[grid](
        x, raw, out, m, n, k, x.stride(0), raw.stride(0), out.stride(0),
        IS_Q8_0=qtype == "Q8_0", BLOCK_BYTES=BLOCK_BYTES[qtype], BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    return out
