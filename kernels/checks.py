"""Argument checks shared by the kernel wrappers (plain Python; no Triton needed).

A kernel handed a shape it was not written for does not fail: it reads the wrong memory and returns
a plausible-looking wrong answer. So every wrapper checks its inputs first and raises a ValueError
that names the offending value. What the Triton attention kernels serve:

- block sizes: powers of two from 1 to 256. The kernels find a token's slot with `pos // BLOCK_SIZE`
  and `pos % BLOCK_SIZE` on a compile-time constant (a shift and a mask for a power of two).
- head dims: powers of two from 16 to 256. `tl.arange` needs a power-of-two length, and `tl.dot`
  needs an inner dimension of at least 16.
"""

from __future__ import annotations

import torch

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
MAX_BLOCK_SIZE = 256


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def check_block_size(block_size: int) -> None:
    if not (is_power_of_two(block_size) and block_size <= MAX_BLOCK_SIZE):
        raise ValueError(
            f"block_size={block_size} is not supported by the Triton attention kernels: "
            f"use a power of two from 1 to {MAX_BLOCK_SIZE}"
        )


def check_head_dim(head_dim: int) -> None:
    if not (is_power_of_two(head_dim) and MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM):
        raise ValueError(
            f"head_dim={head_dim} is not supported by the Triton attention kernels: "
            f"use a power of two from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}"
        )


def check_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Check a layer's paged cache pair; return (num_blocks, block_size, num_kv_heads, head_dim)."""
    if key_cache.dim() != 4:
        raise ValueError(
            "key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype:
        raise ValueError(
            f"value_cache {tuple(value_cache.shape)} {value_cache.dtype} must match key_cache "
            f"{tuple(key_cache.shape)} {key_cache.dtype}"
        )
    if value_cache.stride() != key_cache.stride():
        raise ValueError("value_cache must have the same strides as key_cache")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along head_dim (stride(-1) == 1)")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    return num_blocks, block_size, num_kv_heads, head_dim


def check_paged_attention_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> tuple[int, int, int, int, int, int]:
    """The paged-attention contract's shapes, dtypes and devices, whatever the implementation.

    Returns (num_tokens, num_heads, num_seqs, block_size, num_kv_heads, head_dim).
    """
    _, block_size, num_kv_heads, head_dim = check_kv_cache(key_cache, value_cache)
    if query.dim() != 3 or query.shape[2] != head_dim:
        raise ValueError(
            f"query must be [num_tokens, num_heads, head_dim={head_dim}], got {tuple(query.shape)}"
        )
    num_tokens, num_heads, _ = query.shape
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query is {query.dtype} but the cache is {key_cache.dtype}")
    num_seqs = check_attention_metadata(block_tables, seq_lens, query_start_loc)
    check_same_device(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
    )
    return num_tokens, num_heads, num_seqs, block_size, num_kv_heads, head_dim


def check_attention_metadata(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor
) -> int:
    """The shapes and dtypes of a step's attention metadata; returns num_seqs."""
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be 2-D, got shape {tuple(block_tables.shape)}")
    num_seqs = block_tables.shape[0]
    check_int_tensor("block_tables", block_tables, tuple(block_tables.shape))
    check_int_tensor("seq_lens", seq_lens, (num_seqs,))
    check_int_tensor("query_start_loc", query_start_loc, (num_seqs + 1,))
    return num_seqs


def check_window_and_soft_cap(sliding_window: int | None, logits_soft_cap: float | None) -> None:
    """A layer's sliding window (None, or at least 1 token) and soft cap (None, or above 0)."""
    is_int = isinstance(sliding_window, int) and not isinstance(sliding_window, bool)
    if sliding_window is not None and not (is_int and sliding_window >= 1):
        raise ValueError(f"sliding_window must be None or an int >= 1, got {sliding_window!r}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be None or > 0, got {logits_soft_cap!r}")


def check_int_tensor(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def check_device_for_mode(t: torch.Tensor, interpreted: bool) -> None:
    """Compiled kernels need CUDA tensors; the interpreter takes CPU (or CUDA) tensors."""
    if not interpreted and t.device.type != "cuda":
        raise ValueError(
            f"the Triton kernels are compiled for the GPU here, but got tensors on {t.device}; "
            "move them to CUDA (or set TRITON_INTERPRET=1 before starting Python)"
        )
