"""The oracle for the Triton quantized matmul: y = x W^T with W in llama.cpp's Q8_0 or Q4_0 blocks, in plain torch.

A row of W with K input features is K / 32 blocks, one after another:

    Q8_0  34 bytes: a float16 scale d, then 32 int8 q                 w_j = q_j * d
    Q4_0  18 bytes: d, then 16 bytes; byte i holds q_i (low nibble)
          and q_{i+16} (high nibble), 0..15                          w_j = (q_j - 8) * d

`dequantize_ref` writes W out in float32 with these formulas (the `gguf` package's, in the same
float32 arithmetic: tests/kernels/test_kernel_quantized_matmul_triton.py checks it bit for bit),
and `quantized_matmul_ref` multiplies: x @ W^T in float32. The engine's own dequantization is
`nanovllm/models/gguf_quants.py` (Q4_1 too); this module repeats the two formulas because the
kernels folder depends on nothing of the engine's.
"""

from __future__ import annotations

import torch

BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18}  # bytes per block of 32 weights


def check_quantized_args(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> None:
    """A clear error for a type or shapes the kernels do not take."""
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"qtype must be one of {list(BLOCK_BYTES)}, got {qtype!r}")
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise ValueError(f"raw must be uint8 [out, row_bytes], got {raw.dtype} {tuple(raw.shape)}")
    k = x.shape[-1]
    if k % 32 or raw.shape[1] != k // 32 * BLOCK_BYTES[qtype]:
        raise ValueError(
            f"x has {k} features; a {qtype} row of them is {k // 32 * BLOCK_BYTES[qtype]} bytes "
            f"(whole blocks of 32), raw rows have {raw.shape[1]}"
        )


def dequantize_ref(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """W in float32: raw uint8 [N, K / 32 * block_bytes] -> [N, K]."""
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, BLOCK_BYTES[qtype])  # [N, K / 32, block_bytes]
    d = blocks[..., :2].contiguous().view(torch.float16).to(torch.float32)  # [N, K / 32, 1]
    if qtype == "Q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32)
        return (q * d).view(n, -1)
    nibbles = blocks[..., 2:]
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).to(torch.int8) - 8
    return (d * q.to(torch.float32)).view(n, -1)


def quantized_matmul_ref(
    x: torch.Tensor,  # [M, K]
    raw: torch.Tensor,  # [N, K / 32 * block_bytes] uint8
    qtype: str,  # "Q8_0" or "Q4_0"
) -> torch.Tensor:  # [M, N] float32
    """x @ W^T in float32, W dequantized first."""
    check_quantized_args(x, raw, qtype)
    return x.to(torch.float32) @ dequantize_ref(raw, qtype).to(x.device).T
