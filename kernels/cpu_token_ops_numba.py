"""Per-token CPU kernels, compiled by numba: RMSNorm, rotary embeddings (RoPE), SwiGLU's
activation, and a residual add fused with the RMSNorm after it.

What they compute is the torch code they replace, which stays in the model as the reference:
`RMSNorm.forward` (models/layernorm.py), `RotaryEmbedding.forward` (models/rotary.py),
`F.silu(gate) * up` (`MLP.forward`) and `x + attention(...)` then `post_attention_layernorm`
(`DecoderLayer.forward`).

    rms_norm:  out[t] = weight * x[t] / sqrt(mean(x[t]^2) + eps)
    rotary:    for each head's feature pair (i, i + d/2) of token t, at position p = positions[t]:
                   out[i]       = x[i] * cos[p, i]       - x[i + d/2] * sin[p, i]
                   out[i + d/2] = x[i + d/2] * cos[p, i + d/2] + x[i] * sin[p, i + d/2]
               (Hugging Face's "rotate half" layout; cos and sin are the model's tables)
    silu_and_mul:        out[t, i] = silu(x[t, i]) * x[t, d + i], x = [gate | up], d = its half
                         (vLLM's `SiluAndMul`)
    fused_add_rms_norm:  residual[t] += x[t]; out[t] = rms_norm(residual[t])
                         (vLLM's `fused_add_rms_norm`)

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

from nanovllm.kernels.cpu_paged_attention_numba import exp_nonpositive

# Reassociate and contract (vectorised sums, FMA), keep IEEE infinities and NaN.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@njit(inline="always", fastmath=_FASTMATH)
def _rms_norm_row(out, x, t, weight, eps):
    """out[t] = weight * x[t] / sqrt(mean(x[t]^2) + eps)."""
    hidden = x.shape[1]
    sum_sq = np.float32(0.0)
    for h in range(hidden):
        sum_sq += x[t, h] * x[t, h]
    inv_rms = np.float32(1.0) / np.sqrt(sum_sq / np.float32(hidden) + np.float32(eps))
    for h in range(hidden):
        out[t, h] = weight[h] * (x[t, h] * inv_rms)


@njit(cache=True, fastmath=_FASTMATH, nogil=True)
def rms_norm(
    out,  # [num_tokens, hidden] float32, written
    x,  # [num_tokens, hidden] float32
    weight,  # [hidden] float32
    eps,  # float
):
    for t in range(x.shape[0]):
        _rms_norm_row(out, x, t, weight, eps)


@njit(cache=True, fastmath=_FASTMATH, nogil=True)
def fused_add_rms_norm(
    out,  # [num_tokens, hidden] float32, written: the normed sum
    residual,  # [num_tokens, hidden] float32: x added to it, in place
    x,  # [num_tokens, hidden] float32
    weight,  # [hidden] float32
    eps,  # float
):
    """The residual add and the RMSNorm after it, one token at a time: the sum is normed while
    its row is still in the L1 cache (the separate add writes all rows, the norm reads them
    back)."""
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            residual[t, h] += x[t, h]
        _rms_norm_row(out, residual, t, weight, eps)


# error_model="numpy": a division by zero gives inf, as in numpy, instead of numba's check that
# raises ZeroDivisionError; the check kept the loop from vectorising (8x slower, README).
@njit(cache=True, fastmath=_FASTMATH, nogil=True, error_model="numpy")
def silu_and_mul(
    out,  # [num_tokens, d] float32, written
    x,  # [num_tokens, 2 * d] float32: gate, then up
):
    """silu(gate) * up, with silu(g) = g * sigmoid(g) and sigmoid from one exp of -|g| (never
    positive, so `exp_nonpositive`'s vectorised arithmetic serves, and 1 + e never overflows):
    sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) below."""
    d = out.shape[1]
    for t in range(x.shape[0]):
        for i in range(d):
            g = x[t, i]
            e = exp_nonpositive(min(g, -g))
            numerator = np.float32(1.0) if g >= np.float32(0.0) else e
            out[t, i] = g * numerator / (np.float32(1.0) + e) * x[t, d + i]


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


@njit(cache=True, fastmath=_FASTMATH, nogil=True)
def rotary_and_store_kv(
    q_out,  # [num_tokens, num_heads, head_dim] float32: written, q rotated
    qkv,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim] float32, contiguous
    positions,  # [num_tokens] int64
    cos,  # [max_position, head_dim] float32
    sin,  # [max_position, head_dim] float32
    key_cache,  # [num_blocks, block_size, num_kv_heads, head_dim] float32: k rotated, written
    value_cache,  # [num_blocks, block_size, num_kv_heads, head_dim] float32: v written
    slot_mapping,  # [num_tokens] int64
):
    """What the attention layer does between its QKV projection and paged attention, in one
    pass per token: split the fused output, rotate q and k (`rotary`'s arithmetic), and write
    k and v into the token's cache slot (`store_kv`). Returns -1, or the first token whose
    position is outside the tables or whose slot is outside the cache (nothing of that token
    or the ones after it is written)."""
    num_heads, head_dim = q_out.shape[1], q_out.shape[2]
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    num_slots = key_cache.shape[0] * block_size
    half = head_dim // 2
    k_start = num_heads * head_dim
    v_start = k_start + num_kv_heads * head_dim
    for t in range(qkv.shape[0]):
        p, slot = positions[t], slot_mapping[t]
        if p < 0 or p >= cos.shape[0] or slot < 0 or slot >= num_slots:
            return t
        block, offset = slot // block_size, slot % block_size
        for h in range(num_heads):
            x = qkv[t, h * head_dim : (h + 1) * head_dim]
            for i in range(half):
                x1, x2 = x[i], x[i + half]
                q_out[t, h, i] = x1 * cos[p, i] - x2 * sin[p, i]
                q_out[t, h, i + half] = x2 * cos[p, i + half] + x1 * sin[p, i + half]
        for h in range(num_kv_heads):
            x = qkv[t, k_start + h * head_dim : k_start + (h + 1) * head_dim]
            for i in range(half):
                x1, x2 = x[i], x[i + half]
                key_cache[block, offset, h, i] = x1 * cos[p, i] - x2 * sin[p, i]
                key_cache[block, offset, h, i + half] = (
                    x2 * cos[p, i + half] + x1 * sin[p, i + half]
                )
            for d in range(head_dim):
                value_cache[block, offset, h, d] = qkv[t, v_start + h * head_dim + d]
    return -1
