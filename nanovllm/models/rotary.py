"""Rotary position embeddings (RoPE), with Llama 3-style or linear frequency scaling.

RoPE encodes a token's position by rotating pairs of its query and key features by an angle
proportional to the position: feature pair i turns at frequency `inv_freq[i] = theta^(-2i/d)`.
The dot product of a rotated query and key then depends only on their *distance*, which is what
attention needs. Because the rotation is applied before K is written to the cache, cached keys
never need to be touched again.

We precompute cos and sin for every position up to `max_position` once; a step just indexes
them with its token positions (which is how a flat, unpadded batch of requests at different
positions gets the right rotation per token). The layout is Hugging Face's "rotate half": the
first and second halves of the head dimension form the pairs.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def compute_inv_freq(head_dim: int, rope_parameters: dict) -> torch.Tensor:
    """Inverse frequencies, one per feature pair: [head_dim // 2]."""
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    base = float(rope_parameters.get("rope_theta", 10000.0))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":  # positions divided by `factor` (Gemma 3's global layers)
        return inv_freq / rope_parameters["factor"]
    if rope_type != "llama3":
        raise ValueError(
            f"unsupported rope_type {rope_type!r} (supported: 'default', 'linear', 'llama3')"
        )
    # Llama 3.1: long wavelengths are stretched by `factor`, short ones kept, and the band in
    # between interpolated smoothly, so the model extends its context without retraining.
    factor = rope_parameters["factor"]
    low_freq_factor = rope_parameters["low_freq_factor"]
    high_freq_factor = rope_parameters["high_freq_factor"]
    old_context_len = rope_parameters["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """q and k rotated by their tokens' positions, from tables of cos and sin."""

    def __init__(self, head_dim: int, max_position: int, rope_parameters: dict) -> None:
        super().__init__()
        inv_freq = compute_inv_freq(head_dim, rope_parameters)  # [head_dim // 2]
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_position, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_position, head_dim]
        # fp32 tables, cast to the activations' dtype when used (as Hugging Face does).
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens]; q: [num_tokens, num_heads, head_dim]; k: [.., num_kv_heads, ..]
        cos = self.cos_cached[positions].unsqueeze(1).to(q.dtype)  # [num_tokens, 1, head_dim]
        sin = self.sin_cached[positions].unsqueeze(1).to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
