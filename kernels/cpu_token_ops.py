"""RMSNorm, RoPE, SwiGLU's activation and the residual add before a norm on a CPU, through one
numba loop each (`cpu_token_ops_numba.py`).

`applies(x)` says whether the kernels serve an activation: float32 on a CPU, with numba
importable, outside torch.compile (inductor fuses these operators itself and cannot trace a
numba call). The CPU backend asks it once, when it builds the model, and then gives the norms
the rotary embedding and the decoder layers their numba classes (`nanovllm/backends/cpu.py`).
Everywhere else the model runs its own torch code, which is the reference these kernels are
tested against (`tests/kernels/test_kernel_cpu_token_ops.py`): `RMSNorm.forward` in
models/layernorm.py, `DecoderLayer.forward` in models/llama.py, `RotaryEmbedding.forward` in
models/rotary.py.
"""

from __future__ import annotations

import functools
import importlib
import logging

import torch

logger = logging.getLogger("nanovllm.kernels")


@functools.cache
def _numba_kernels():
    """The numba kernel module, or None (with one logged notice) when numba cannot be imported."""
    try:
        return importlib.import_module("nanovllm.kernels.cpu_token_ops_numba")
    except ImportError as e:
        logger.warning(
            "nanovllm: numba is not available (%s); RMSNorm and RoPE run as plain torch "
            "operators, which is slower on a CPU. `pip install numba` for the fast path.",
            e,
        )
        return None


def applies(x: torch.Tensor) -> bool:
    """Whether the kernels serve this activation (see the module docstring)."""
    return (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and _numba_kernels() is not None
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight * x / rms(x) over the last dimension, as a new tensor; None when x is not
    contiguous (the caller's torch code then runs: a strided view would need a copy first)."""
    if not x.is_contiguous():
        return None
    hidden = x.shape[-1]
    out = torch.empty_like(x)
    _numba_kernels().rms_norm(
        out.view(-1, hidden).numpy(),
        x.detach().view(-1, hidden).numpy(),
        weight.detach().numpy(),
        eps,
    )
    return out


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden] float32, contiguous
    residual: torch.Tensor,  # [num_tokens, hidden] float32, contiguous: x is added to it
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [num_tokens, hidden]: weight * residual / rms(residual), residual updated
    """vLLM's `fused_add_rms_norm`: residual += x, then the RMSNorm of the sum, in one pass."""
    out = torch.empty_like(x)
    _numba_kernels().fused_add_rms_norm(
        out.numpy(), residual.detach().numpy(), x.detach().numpy(), weight.detach().numpy(), eps
    )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """vLLM's `SiluAndMul`: x = [gate | up] ([num_tokens, 2 * d] float32, contiguous) gives
    silu(gate) * up ([num_tokens, d]), in one pass."""
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=torch.float32)
    _numba_kernels().silu_and_mul(out.numpy(), x.detach().numpy())
    return out


def rotary(
    positions: torch.Tensor,  # [num_tokens] int
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], any strides
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], any strides
    cos: torch.Tensor,  # [max_position, head_dim] float32
    sin: torch.Tensor,  # [max_position, head_dim] float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated to their tokens' positions, as new contiguous tensors."""
    # Contiguous copies, rotated in place (the kernel's loops vectorise only on contiguous rows).
    q_out = q.detach().clone(memory_format=torch.contiguous_format)
    k_out = k.detach().clone(memory_format=torch.contiguous_format)
    bad = _numba_kernels().rotary(
        q_out.numpy(), k_out.numpy(), positions.to(torch.int64).numpy(), cos.numpy(), sin.numpy()
    )
    if bad >= 0:
        raise ValueError(
            f"token {bad} is at position {int(positions[bad])}, outside the rotary tables' "
            f"{cos.shape[0]} positions (0 .. {cos.shape[0] - 1})"
        )
    return q_out, k_out


def rotary_and_store_kv(
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], contiguous
    num_heads: int,
    positions: torch.Tensor,  # [num_tokens] int
    cos: torch.Tensor,  # [max_position, head_dim] float32
    sin: torch.Tensor,  # [max_position, head_dim] float32
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]: written
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]: written
    slot_mapping: torch.Tensor,  # [num_tokens] int
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], q rotated
    """The fused QKV output split, q and k rotated to their positions (`rotary`), k and v
    written into their slots (`store_kv`), in one loop; returns q."""
    num_tokens, head_dim = qkv.shape[0], key_cache.shape[3]
    q = torch.empty(num_tokens, num_heads, head_dim, dtype=torch.float32)
    positions, slot_mapping = positions.to(torch.int64), slot_mapping.to(torch.int64)
    bad = _numba_kernels().rotary_and_store_kv(
        q.numpy(),
        qkv.detach().numpy(),
        positions.numpy(),
        cos.numpy(),
        sin.numpy(),
        key_cache.numpy(),
        value_cache.numpy(),
        slot_mapping.numpy(),
    )
    if bad >= 0:
        raise ValueError(
            f"token {bad} is at position {int(positions[bad])} with slot {int(slot_mapping[bad])}:"
            f" outside the rotary tables' {cos.shape[0]} positions or the cache's "
            f"{key_cache.shape[0] * key_cache.shape[1]} slots"
        )
    return q
