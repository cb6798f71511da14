"""Per-token CPU kernels, compiled by numba: RMSNorm and rotary embeddings (RoPE).

What they compute is the torch code they replace, which stays in the model as the reference:
`RMSNorm.forward` (models/llama.py) and `RotaryEmbedding.forward` (models/rotary.py).

    rms_norm:  out[t] = weight * x[t] / sqrt(mean(x[t]^2) + eps)
    rotary:    for each head's feature pair (i, i + d/2) of token t, at position p = positions[t]:
                   out[i]       = x[i] * cos[p, i]       - x[i + d/2] * sin[p, i]
                   out[i + d/2] = x[i + d/2] * cos[p, i + d/2] + x[i] * sin[p, i + d/2]
               (Hugging Face's "rotate half" layout; cos and sin are the model's tables)

Why: in a decode step these run on a few dozen tokens, and torch spends most of their time
between its operators, not in them. RMSNorm is five operators (pow, mean, add, rsqrt, two muls),
RoPE per tensor a gather of cos and sin, a split, a negation, a concatenation, two products and a
sum; each is a separate call that reads and writes the whole activation. One loop does it all
in one pass (the two side by side: `python -m nanovllm.bench.tools.cpu_token_ops`; figures in
kernels/README.md).

How work maps: one thread, one loop over tokens (no `prange`): a decode step has too few tokens
to pay for waking threads. LLVM vectorises the loops over features (`fastmath` lets it
reassociate the sum of squares, so the result agrees with torch's to rounding, not bit for bit).
The arrays must be contiguous: numba compiles a strided view's indexing without knowing that
its last dimension is contiguous, so its loops over the strided q and k views of the fused QKV
output do not vectorise (kernels/README.md). float32 only, like the CPU engine.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Reassociate and contract (vectorised sums, FMA), keep IEEE infinities and NaN.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@njit(cache=True, fastmath=_FASTMATH, nogil=True)
def rms_norm(
    out,  # [num_tokens, hidden] float32, written
    x,  # [num_tokens, hidden] float32
    weight,  # [hidden] float32
    eps,  # float
):
    num_tokens, hidden = x.shape
    for t in range(num_tokens):
        sum_sq = np.float32(0.0)
        for h in range(hidden):
            sum_sq += x[t, h] * x[t, h]
        inv_rms = np.float32(1.0) / np.sqrt(sum_sq / np.float32(hidden) + np.float32(eps))
        for h in range(hidden):
            out[t, h] = weight[h] * (x[t, h] * inv_rms)


@njit(cache=True, fastmath=_FASTMATH, nogil=True)
def _rotate(x, t, p, cos, sin):
    """Rotate every head of token t of x, in place, to position p."""
    half = x.shape[2] // 2
    for h in range(x.shape[1]):
        for i in range(half):
            x1, x2 = x[t, h, i], x[t, h, i + half]
            x[t, h, i] = x1 * cos[p, i] - x2 * sin[p, i]
            x[t, h, i + half] = x2 * cos[p, i + half] + x1 * sin[p, i + half]


@njit(cache=True, fastmath=_FASTMATH, nogil=True)
def rotary(
    q,  # [num_tokens, num_heads, head_dim] float32, contiguous: rotated in place
    k,  # [num_tokens, num_kv_heads, head_dim] float32, contiguous: rotated in place
    positions,  # [num_tokens] int64
    cos,  # [max_position, head_dim] float32
    sin,  # [max_position, head_dim] float32
):
    """Returns -1, or the first token whose position is outside the tables (that token and
    the ones after it are left as they were)."""
    for t in range(q.shape[0]):
        p = positions[t]
        if p < 0 or p >= cos.shape[0]:
            return t
        _rotate(q, t, p, cos, sin)
        _rotate(k, t, p, cos, sin)
    return -1
