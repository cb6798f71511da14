"""llama.cpp's block quantizations, kept as they are stored: Q8_0, Q4_0 and Q4_1, and their reference dequantization.

A quantized weight row of `in` features is `in / 32` blocks, one after another, each 32 weights
sharing a scale stored as an IEEE float16 (`d`):

    Q8_0  34 bytes: d, then 32 int8 q                  weight j = q_j * d
    Q4_0  18 bytes: d, then 16 bytes of 4-bit q        weight j = (q_j - 8) * d
    Q4_1  20 bytes: d, a float16 minimum m, 16 bytes   weight j = q_j * d + m

In a 4-bit block, byte i holds weight i in its low nibble and weight i + 16 in its high one.
So a Q8_0 weight costs 8.5 bits, Q4_0 4.5 and Q4_1 5, against float32's 32. The formulas are
the `gguf` package's `gguf.quants.dequantize` (llama.cpp's own Python), in the same float32
arithmetic, so `dequantize` here gives the very same floats (tests/test_gguf_quants.py).

`QuantizedTensor` is such a weight in memory: its bytes, uint8 [rows, in / 32 * block_bytes]
(a tensor, or a read-only view of the memory-mapped file), with the logical [rows, in] shape
the layers' weight loaders check and `.narrow` on whole rows, or on whole blocks of columns,
which is all a weight loader does. Any other GGUF type (F32, F16, BF16, the K-quants) reaches a
quantized layer already dequantized by `gguf`, and is held as type "F32": its float32 bytes,
one 4-byte "block" per weight, so a layer has one representation whatever its file held.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class BlockFormat:
    """A block quantization's layout: weights per block and bytes per block."""

    name: str
    block_size: int  # weights per block
    block_bytes: int  # bytes per block


# The types a quantized layer keeps as they are (and "F32", the form of every other type).
FORMATS = {
    "Q8_0": BlockFormat("Q8_0", 32, 2 + 32),
    "Q4_0": BlockFormat("Q4_0", 32, 2 + 16),
    "Q4_1": BlockFormat("Q4_1", 32, 2 + 2 + 16),
    "F32": BlockFormat("F32", 1, 4),
}
KEPT_TYPES = ("Q8_0", "Q4_0", "Q4_1")


def _half(raw: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at bytes [start, start + 2) of each block, as float32: raw [..., blocks, bytes]
    -> [..., blocks, 1]."""
    return raw[..., start : start + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """A 4-bit block's 32 values: qs uint8 [..., 16] -> [..., 32] (low nibbles, then high)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def dequantize(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """A quantized weight's float32 values: raw uint8 [rows, row_bytes] -> [rows, in]."""
    fmt = FORMATS[qtype]
    rows = raw.shape[0]
    if qtype == "F32":
        return raw.contiguous().view(torch.float32).view(rows, -1)
    blocks = raw.reshape(rows, -1, fmt.block_bytes)  # [rows, in / 32, block_bytes]
    d = _half(blocks, 0)
    if qtype == "Q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32)
        return (q * d).view(rows, -1)
    if qtype == "Q4_0":
        q = _nibbles(blocks[..., 2:]).to(torch.int8) - 8
        return (d * q.to(torch.float32)).view(rows, -1)
    m = _half(blocks, 2)
    q = _nibbles(blocks[..., 4:]).to(torch.float32)
    return ((d * q) + m).view(rows, -1)


def row_bytes(qtype: str, columns: int) -> int:
    """The bytes of one row of `columns` weights in `qtype` (a clear error if blocks don't fit)."""
    fmt = FORMATS[qtype]
    if columns % fmt.block_size:
        raise ValueError(
            f"a {qtype} row holds blocks of {fmt.block_size} weights: {columns} columns do not fit"
        )
    return columns // fmt.block_size * fmt.block_bytes


class QuantizedTensor:
    """A weight kept in its GGUF type: bytes [rows, row_bytes] and the logical shape [rows, in].

    It offers what the layers' weight loaders use of a tensor: `.shape` (logical), `.data`,
    `.narrow(dim, start, n)` (views of whole rows, or of whole blocks of columns), `copy_` and
    `zero_` (on bytes, both of the same type), `[a:b]` (rows).
    """

    def __init__(self, raw: torch.Tensor | np.ndarray, qtype: str, columns: int) -> None:
        if qtype not in FORMATS:
            raise ValueError(f"QuantizedTensor: unknown type {qtype!r}, not one of {list(FORMATS)}")
        if raw.shape[1] != row_bytes(qtype, columns):
            raise ValueError(
                f"QuantizedTensor: rows of {raw.shape[1]} bytes do not hold {columns} {qtype} weights"
            )
        self.raw = raw  # [rows, row_bytes] uint8
        self.qtype = qtype
        self.shape = torch.Size((raw.shape[0], columns))

    @classmethod
    def empty(cls, shape: tuple[int, int], qtype: str, device=None) -> QuantizedTensor:
        rows, columns = shape
        raw = torch.empty(rows, row_bytes(qtype, columns), dtype=torch.uint8, device=device)
        return cls(raw, qtype, columns)

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> QuantizedTensor:
        """A float tensor [rows, in] as type "F32" (its float32 bytes)."""
        dense = weight.detach().to(torch.float32).contiguous()
        return cls(dense.view(torch.uint8).view(dense.shape[0], -1), "F32", dense.shape[1])

    @property
    def data(self) -> QuantizedTensor:
        return self

    @property
    def nbytes(self) -> int:
        return self.raw.shape[0] * self.raw.shape[1]

    def narrow(self, dim: int, start: int, length: int) -> QuantizedTensor:
        dim = dim % 2
        if not (0 <= start and 0 <= length and start + length <= self.shape[dim]):
            raise IndexError(f"narrow({dim}, {start}, {length}) outside shape {tuple(self.shape)}")
        if dim == 0:
            return QuantizedTensor(self.raw[start : start + length], self.qtype, self.shape[1])
        size = FORMATS[self.qtype].block_size
        if start % size or length % size:
            raise ValueError(
                f"{self.qtype} columns are cut in whole blocks of {size}: narrow(1, {start}, "
                f"{length}) is not"
            )
        a, n = row_bytes(self.qtype, start), row_bytes(self.qtype, length)
        return QuantizedTensor(self.raw[:, a : a + n], self.qtype, length)

    def __getitem__(self, rows: slice) -> QuantizedTensor:
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("QuantizedTensor: only contiguous rows can be sliced")
        return self.narrow(0, start, max(0, stop - start))

    def copy_(self, src: QuantizedTensor) -> QuantizedTensor:
        if not isinstance(src, QuantizedTensor) or src.qtype != self.qtype:
            got = src.qtype if isinstance(src, QuantizedTensor) else type(src).__name__
            raise ValueError(f"cannot copy {got} weights into {self.qtype} ones")
        if tuple(src.shape) != tuple(self.shape):
            raise ValueError(f"cannot copy shape {tuple(src.shape)} into {tuple(self.shape)}")
        if isinstance(src.raw, np.ndarray) and self.raw.device.type == "cpu":
            self.raw.numpy()[...] = src.raw  # straight from the file's pages: no copy between
        else:
            self.raw.copy_(
                torch.as_tensor(np.asarray(src.raw)) if isinstance(src.raw, np.ndarray) else src.raw
            )
        return self

    def zero_(self) -> QuantizedTensor:
        self.raw.zero_()  # (scale 0, minimum 0: every weight 0, in each type)
        return self

    def dequantize(self) -> torch.Tensor:
        """The float32 values [rows, in]."""
        raw = self.raw
        if isinstance(raw, np.ndarray):
            raw = torch.from_numpy(np.array(raw))
        return dequantize(raw, self.qtype)

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.qtype}, shape={tuple(self.shape)})"
