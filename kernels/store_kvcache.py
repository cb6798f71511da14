"""store_kvcache: write this step's keys and values into the paged KV cache.

What it computes (reference: `reference.store_kvcache_ref`)::

    for t in range(num_tokens):
        if slot_mapping[t] >= 0:
            block, offset = divmod(slot_mapping[t], block_size)
            key_cache[block, offset] = key[t]  # [num_kv_heads, head_dim]
            value_cache[block, offset] = value[t]

How programs map onto the work: one program per token. Program t loads its slot, then copies the
token's whole [num_kv_heads, head_dim] tile of K and of V in one masked load/store each. A program
whose slot is -1 (a padding token) returns at once.

It is a pure copy, so its speed is the memory bandwidth: each token moves
2 * num_kv_heads * head_dim elements in and out. The tile is padded up to powers of two (Triton's
`tl.arange` needs them) and masked, so any number of kv heads and any head dim work.
"""

from __future__ import annotations

import torch

from nanovllm.kernels import checks, triton_setup

triton_setup.configure()  # decides interpreter vs compiled; must run before `import triton`
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _store_kvcache_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens]
    block_size,
    stride_kt,  # key: strides of the token and head dims (head_dim is contiguous)
    stride_kh,
    stride_vt,  # value: same
    stride_vh,
    stride_cb,  # caches: strides of the block, offset-in-block and head dims
    stride_co,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    KV_HEADS_PADDED: tl.constexpr,  # NUM_KV_HEADS and HEAD_DIM rounded up to powers of two
    HEAD_DIM_PADDED: tl.constexpr,
):
    token = tl.program_id(0)
    # int64: slot * stride can pass 2**31 in a large cache.
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # a padding token: nothing to store
        return
    block = slot // block_size
    offset = slot % block_size

    heads = tl.arange(0, KV_HEADS_PADDED)  # [H]
    dims = tl.arange(0, HEAD_DIM_PADDED)  # [D]
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)  # [H, D] the real tile

    src_k = key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :]  # [H, D]
    src_v = value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :]  # [H, D]
    dst = block * stride_cb + offset * stride_co + heads[:, None] * stride_ch + dims[None, :]
    tl.store(key_cache_ptr + dst, tl.load(src_k, mask=mask), mask=mask)
    tl.store(value_cache_ptr + dst, tl.load(src_v, mask=mask), mask=mask)


def store_kvcache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int32/int64; -1 = padding, skipped
) -> None:
    """Write token t's key/value into the paged cache at `slot_mapping[t]` (in place)."""
    interpreted = triton_setup.is_interpreted()
    _, block_size, num_kv_heads, head_dim = checks.check_kv_cache(key_cache, value_cache)
    num_tokens = key.shape[0]
    for name, t in (("key", key), ("value", value)):
        if tuple(t.shape) != (num_tokens, num_kv_heads, head_dim):
            raise ValueError(
                f"{name} must be [num_tokens, num_kv_heads, head_dim] = "
                f"{(num_tokens, num_kv_heads, head_dim)}, got {tuple(t.shape)}"
            )
        if t.dtype != key_cache.dtype:
            raise ValueError(f"{name} is {t.dtype} but the cache is {key_cache.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along head_dim (stride(-1) == 1)")
    checks.check_int_tensor("slot_mapping", slot_mapping, (num_tokens,))
    checks.check_same_device(
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=slot_mapping,
    )
    checks.check_device_for_mode(key, interpreted)
    if num_tokens == 0:
        return

    _store_kvcache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        block_size,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        KV_HEADS_PADDED=checks.next_power_of_two(num_kv_heads),
        HEAD_DIM_PADDED=checks.next_power_of_two(head_dim),
    )
