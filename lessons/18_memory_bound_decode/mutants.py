"""Lesson 18 planted bugs: a quantizer that rounds, scales or lays out a block unlike llama.cpp,
a dequantizer that misreads a block's bytes, and a product that loses a block's scale."""

from __future__ import annotations

import torch

from nanovllm.lessons.testing import Mutant, variant


def _round_away(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    whole = torch.floor(a)
    return torch.sign(v) * (whole + torch.floor(2 * (a - whole)))


def _quantize(x, *, bug=""):
    if bug != "no-shape-check" and x.shape[1] % 32:
        raise ValueError(f"in must be a multiple of 32: got shape {tuple(x.shape)}")
    rows = x.shape[0]
    if bug == "no-shape-check" and x.shape[1] % 32:
        x = torch.nn.functional.pad(x, (0, 32 - x.shape[1] % 32))
    blocks = x.float().reshape(rows, -1, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    if bug == "one-scale-per-row":
        amax = amax.amax(dim=1, keepdim=True).expand_as(amax)
    d = amax / (128 if bug == "scale-over-128" else 127)
    if bug == "q-from-the-float16-scale":
        d = d.to(torch.float16).float()
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = (
        blocks / torch.where(d == 0, torch.ones_like(d), d)
        if bug == "divides-by-d"
        else blocks * inverse
    )
    if bug == "round-half-to-even":
        q = torch.round(scaled)
    elif bug == "floor-of-a-plus-half":
        q = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    elif bug == "truncates":
        q = torch.trunc(scaled)
    else:
        q = _round_away(scaled)
    scale_bytes = d.to(torch.float16).view(torch.uint8)
    if bug == "scale-bytes-big-endian":
        scale_bytes = scale_bytes.flip(-1)
    q_bytes = q.to(torch.int8).view(torch.uint8)
    parts = [q_bytes, scale_bytes] if bug == "scale-after-the-values" else [scale_bytes, q_bytes]
    return torch.cat(parts, dim=-1).reshape(rows, -1)


def _dequantize(raw, *, bug=""):
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 34)
    scale = blocks[..., :2]
    if bug == "scale-bytes-swapped":
        scale = scale.flip(-1)
    d = scale.contiguous().view(torch.float16)  # [rows, blocks, 1]
    if bug == "every-block-the-first-blocks-scale":
        d = d[:, :1].expand_as(d)
    q = blocks[..., 2:]
    q = (
        q.to(torch.float32)
        if bug == "values-read-unsigned"
        else q.contiguous().view(torch.int8).float()
    )
    if bug == "multiplied-in-float16":
        return (q.to(torch.float16) * d).float().reshape(rows, -1)
    return (q * d.float()).reshape(rows, -1)


def _matmul(x, raw, *, bug=""):
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 34)  # [out, nb, 34]
    d = blocks[..., :2].contiguous().view(torch.float16).float()  # [out, nb, 1]
    q = blocks[..., 2:].contiguous().view(torch.int8).float()  # [out, nb, 32]
    xb = x.float().reshape(x.shape[0], 1, -1, 32)  # [t, 1, nb, 32]
    sums = (xb * q).sum(-1)  # [t, out, nb]
    if bug == "skips-the-last-block":
        sums = sums[..., :-1]
        d = d[:, :-1]
    if bug == "scale-of-the-first-block":
        d = d[:, :1].expand_as(d)
    if bug == "no-scale":
        return sums.sum(-1)
    if bug == "scale-of-block-from-the-next-row":
        d = d.roll(1, dims=0)
    return (sums * d[..., 0]).sum(-1)


_BUGGY = {"quantize_q8_0": _quantize, "dequantize_q8_0": _dequantize, "matmul_q8_0": _matmul}


def _m(name: str, description: str, fn: str) -> Mutant:
    """The reference with `fn` replaced by its version above with bug `name`."""
    buggy = _BUGGY[fn]
    return Mutant(
        name, description, lambda ref: variant(ref, **{fn: lambda *a: buggy(*a, bug=name)})
    )


MUTANTS = [
    _m("round-half-to-even", "torch.round: 2.5 -> 2, not 3", "quantize_q8_0"),
    _m("floor-of-a-plus-half", "floor(|v| + 0.5) in float32: 0.49999997 -> 1", "quantize_q8_0"),
    _m("truncates", "q = trunc(x / d)", "quantize_q8_0"),
    _m("divides-by-d", "x / d, not x * (1 / d)", "quantize_q8_0"),
    _m("q-from-the-float16-scale", "q computed with d already rounded to float16",
       "quantize_q8_0"),
    _m("scale-over-128", "d = max |x| / 128", "quantize_q8_0"),
    _m("one-scale-per-row", "one d for the whole row, not one per block", "quantize_q8_0"),
    _m("scale-bytes-big-endian", "d's two bytes in the other order", "quantize_q8_0"),
    _m("scale-after-the-values", "each block's 32 values first, then d", "quantize_q8_0"),
    _m("no-shape-check", "a short row padded with zeros, no error", "quantize_q8_0"),
    _m("scale-bytes-swapped", "d read from its bytes in the other order", "dequantize_q8_0"),
    _m("every-block-the-first-blocks-scale", "every block of a row scaled by the first one's d",
       "dequantize_q8_0"),
    _m("values-read-unsigned", "q read as uint8: -1 becomes 255", "dequantize_q8_0"),
    _m("multiplied-in-float16", "q * d in float16", "dequantize_q8_0"),
    _m("skips-the-last-block", "the row's last block left out of the sum", "matmul_q8_0"),
    _m("scale-of-the-first-block", "every block's sum scaled by the first block's d",
       "matmul_q8_0"),
    _m("no-scale", "the sums of x_j * q_j, never multiplied by d", "matmul_q8_0"),
    _m("scale-of-block-from-the-next-row", "each row's sums scaled by another row's d",
       "matmul_q8_0"),
]  # fmt: skip
