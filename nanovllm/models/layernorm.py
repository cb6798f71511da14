"""RMSNorm: each token's features scaled to unit root mean square, then by a learned weight.

Llama and the models that follow it normalise with RMSNorm rather than LayerNorm: no mean is
subtracted and there is no bias, only `x / sqrt(mean(x^2) + eps) * weight`, one token at a time
(so it does not care which request a token of the flat batch belongs to). The mean of squares is
taken in fp32, since in bf16 or fp16 it loses precision; the result is cast back to the model's
dtype before the weight multiplies it, in transformers' order. vLLM keeps it in its own
`layers/layernorm.py`; a backend gives a faster one (`nanovllm/backends/`), and Gemma its own
(`gemma.py`: weights stored centred on 0).
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 for stability."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)
