"""llama.cpp's block quantizations, kept as they are stored: Q8_0, Q4_0 and Q4_1, and their reference dequantization.

A quantized weight row of `in` features is `in / 32` blocks, one after another, each 32 weights
sharing a scale stored as an IEEE float16 (`d`):

    Q8_0  34 bytes: d, then 32 int8 q                  weight j = q_j * d
    Q4_0  18 bytes: d, then 16 bytes of 4-bit q        weight j = (q_j - 8) * d
    Q4_1  20 bytes: d, a float16 minimum m, 16 bytes   weight j = q_j * d + m

The K-quants (Q4_K, Q5_K, Q6_K: what llama.cpp's common presets such as Q4_K_M emit) group
256 weights in a super-block with one float16 scale and 6- or 8-bit scales for its sub-blocks
of 32 or 16 (`_dequantize_k` has the layouts): 4.5, 5.5 and 6.56 bits a weight.
In a 4-bit block, byte i holds weight i in its low nibble and weight i + 16 in its high one.
So a Q8_0 weight costs 8.5 bits, Q4_0 4.5 and Q4_1 5, against float32's 32. The formulas are
the `gguf` package's `gguf.quants.dequantize` (llama.cpp's own Python), in the same float32
arithmetic, so `dequantize` here gives the very same floats (tests/test_gguf_quants.py).

`QuantizedTensor` is such a weight in memory: its bytes, uint8 [rows, in / 32 * block_bytes]
(a tensor, or a read-only view of the memory-mapped file), with the logical [rows, in] shape
the layers' weight loaders check and `.narrow` on whole rows, or on whole blocks of columns,
which is all a weight loader does. Any other GGUF type (F32, F16, BF16, Q5_0, Q2_K, ...) reaches a
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
    # K-quants: super-blocks of 256 weights (see `_dequantize_k`)
    "Q4_K": BlockFormat("Q4_K", 256, 2 + 2 + 12 + 128),
    "Q5_K": BlockFormat("Q5_K", 256, 2 + 2 + 12 + 32 + 128),
    "Q6_K": BlockFormat("Q6_K", 256, 128 + 64 + 16 + 2),
    "F32": BlockFormat("F32", 1, 4),
}
KEPT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")


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
    if qtype.endswith("_K"):
        return _dequantize_k(blocks, qtype).view(rows, -1)
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


def _shifted(x: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """x uint8 [..., n] -> [..., len(shifts), n]: (x >> s) & mask for each shift s."""
    shift = torch.tensor(shifts, dtype=torch.uint8).view(len(shifts), 1)
    return (x.unsqueeze(-2) >> shift) & mask


def _scale_min_k(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's eight 6-bit sub-block scales and minimums, packed in 12 bytes:
    scales uint8 [..., 12] -> (sc, m), each [..., 8] as float32."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.to(torch.float32), mins.to(torch.float32)


def _dequantize_k(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    """A K-quant's super-blocks of 256 weights: blocks uint8 [..., n, bytes] -> [..., n, 256].

    Q4_K  d, dmin (float16), 12 bytes of 6-bit scales sc_s and minimums m_s for 8 sub-blocks
          of 32, 128 bytes of 4-bit q                  weight = d sc_s q - dmin m_s
    Q5_K  the same, and 32 bytes holding each q's fifth bit (bit s for sub-block s)
    Q6_K  128 bytes of q's low 4 bits, 64 of its high 2, 16 int8 scales sc_s for sub-blocks
          of 16, d last                                weight = d sc_s (q - 32)
    Nibbles: in Q4_K/Q5_K sub-blocks 2i and 2i + 1 are the low and high nibbles of bytes
    32i..32i + 31; in Q6_K each 128-weight half takes 64 low bytes (low nibbles, then high)
    and 32 high bytes (bits 0-1, 2-3, 4-5, 6-7).
    """
    lead = blocks.shape[:-1]
    if qtype == "Q6_K":
        ql, qh = blocks[..., :128], blocks[..., 128:192]
        sc = blocks[..., 192:208].contiguous().view(torch.int8).to(torch.float32)  # [..., 16]
        d = (_half(blocks, 208) * sc).unsqueeze(-1)  # [..., 16, 1]
        low = _shifted(ql.reshape(*lead, 2, 64), [0, 4], 0x0F).reshape(*lead, 8, 32)
        high = _shifted(qh.reshape(*lead, 2, 32), [0, 2, 4, 6], 0x03).reshape(*lead, 8, 32)
        q = ((low | (high << 4)).to(torch.int8) - 32).to(torch.float32).reshape(*lead, 16, 16)
        return (d * q).reshape(*lead, 256)
    sc, mins = _scale_min_k(blocks[..., 4:16])
    d = (_half(blocks, 0) * sc).unsqueeze(-1)  # [..., 8, 1]
    dm = (_half(blocks, 2) * mins).unsqueeze(-1)
    qs = blocks[..., -128:]
    q = _shifted(qs.reshape(*lead, 4, 32), [0, 4], 0x0F).reshape(*lead, 8, 32)
    if qtype == "Q5_K":
        qh = _shifted(blocks[..., 16:48], list(range(8)), 0x01)  # [..., 8, 32]
        q = q | (qh << 4)
    return (d * q.to(torch.float32) - dm).reshape(*lead, 256)


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

    def rows(self, ids: torch.Tensor) -> QuantizedTensor:
        """Rows `ids` (int64 [n]), in any order (an embedding's lookup)."""
        return QuantizedTensor(self.raw.index_select(0, ids), self.qtype, self.shape[1])

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
