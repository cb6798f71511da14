"""Fused mixture of experts (Triton): tokens sorted by expert, one grouped matmul per weight.

Computes what `fused_moe_reference.fused_experts_ref` computes,

    out[t] = sum over j < k of  topk_weights[t, j] * w2[e] @ (silu(gate_e x[t]) * up_e x[t]),
    e = topk_ids[t, j],

without its loop over experts. A batch's `num_tokens * k` (token, expert) pairs are first sorted
by expert, and each expert's run is padded to a multiple of BLOCK_SIZE_M (`moe_align_block_size`),
so every block of BLOCK_SIZE_M sorted pairs belongs to one expert. Then one kernel launch does
every expert's matmul at once (a grouped GEMM): program (m, n) takes block m's pairs, reads their
token rows and its expert's weights, and computes a BLOCK_SIZE_M x BLOCK_SIZE_N tile of their
output. An expert no token chose has no block and costs nothing; the padding rows are masked.

`fused_experts`, as vLLM runs it (`vllm/model_executor/layers/fused_moe/fused_moe.py`):

    sorted_token_ids, expert_ids, num_tokens_post_padded = moe_align_block_size(topk_ids, ...)
    cache1 = fused_moe_kernel(x,      w13)   [num_tokens * k, 2 * I]  row p = pair p's gate|up
    cache2 = silu(gate) * up                 [num_tokens * k, I]      (torch, between launches)
    cache3 = fused_moe_kernel(cache2, w2)    [num_tokens * k, hidden] times pair p's weight
    out    = cache3.view(num_tokens, k, hidden).sum(1)

The combine is split as vLLM splits it: the router's weight is multiplied into each row by the
second launch (MUL_ROUTED_WEIGHT, in float32 before rounding), and the k rows of a token are
added by a final `sum` over k. The first launch reads token row `pair // k` of the hidden states
(a token's k pairs share its row; no copy of the input is made), the second reads row `pair` of
cache2. Each launch writes row `pair` of its output, so the output is in token order again and
no un-permute is needed.

What this version leaves out of vLLM's: GROUP_SIZE_M's grouped launch order (an L2-cache
optimisation), tuned per-GPU tile configurations, quantised weights, and `moe_align_block_size`
as a CUDA kernel (here it is a few torch ops that never read a value back to the host, so it can
be captured in a CUDA graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanovllm.kernels import checks, triton_setup
from nanovllm.kernels.fused_moe_reference import check_expert_ids, check_moe_args

triton_setup.configure()  # decides interpreter vs compiled; must run before `import triton`
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def moe_align_block_size(
    topk_ids: torch.Tensor,  # [num_tokens, k] int
    block_size: int,
    num_experts: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, expert) pairs by expert and pad each expert's run to `block_size`.

    Pair p is `topk_ids.flatten()[p]` (token p // k, its choice p % k). Returns
    - sorted_token_ids [max_num_tokens_padded] int32: the pairs of expert 0, padding, the pairs
      of expert 1, padding, ...; pairs keep token order within an expert; padding and the tail
      past num_tokens_post_padded hold num_tokens * k, which no pair has.
    - expert_ids [max_num_m_blocks] int32: the expert of each block of `block_size` entries
      (-1 for blocks past num_tokens_post_padded).
    - num_tokens_post_padded [1] int32: how many entries the padded runs fill.
    The buffers have their largest possible size (every expert padding block_size - 1 entries),
    so their shapes do not depend on the routing.
    """
    device = topk_ids.device
    flat = topk_ids.flatten().long()  # [num_pairs]
    num_pairs = flat.numel()
    max_num_tokens_padded = num_pairs + num_experts * (block_size - 1)
    max_num_m_blocks = -(-max_num_tokens_padded // block_size)

    # [num_experts] pairs per expert (scatter_add_, not bincount, which reads the largest id
    # back to size its output: a CUDA graph cannot hold that)
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size  # [num_experts]
    padded_end = padded.cumsum(0)  # [num_experts] where each expert's padded run ends
    padded_start = padded_end - padded
    start = counts.cumsum(0) - counts  # [num_experts] where each run starts, unpadded

    order = torch.sort(flat, stable=True).indices  # [num_pairs] pair ids grouped by expert
    expert_of = flat[order]
    rank_in_expert = torch.arange(num_pairs, device=device) - start[expert_of]
    sorted_token_ids = torch.full(
        (max_num_tokens_padded,), num_pairs, dtype=torch.int32, device=device
    )
    sorted_token_ids[padded_start[expert_of] + rank_in_expert] = order.to(torch.int32)

    block_start = torch.arange(max_num_m_blocks, device=device) * block_size
    # The expert whose padded run holds a block's first entry (empty runs are skipped).
    expert_ids = torch.searchsorted(padded_end, block_start, right=True)
    num_tokens_post_padded = padded_end[-1:].to(torch.int32)
    expert_ids = torch.where(block_start < num_tokens_post_padded, expert_ids, -1)
    return sorted_token_ids, expert_ids.to(torch.int32), num_tokens_post_padded


@triton.jit
def fused_moe_kernel(
    a_ptr,  # [rows, K]: hidden_states (row = pair // top_k) or cache2 (row = pair, top_k = 1)
    b_ptr,  # [num_experts, N, K]: w13 or w2
    c_ptr,  # [num_pairs, N]: row = pair
    topk_weights_ptr,  # [num_pairs] float32 (read if MUL_ROUTED_WEIGHT)
    sorted_token_ids_ptr,  # [max_num_tokens_padded] int32 (moe_align_block_size)
    expert_ids_ptr,  # [max_num_m_blocks] int32
    num_tokens_post_padded_ptr,  # [1] int32
    N,
    K,
    num_valid_tokens,  # num_pairs: a sorted id >= this is padding
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    top_k: tl.constexpr,
    DOT_FP32: tl.constexpr,  # upcast before tl.dot (interpreter with bfloat16, see fused_experts)
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32, so a GPU does not round to TF32
):
    pid_m = tl.program_id(0)  # which block of sorted pairs (one expert)
    pid_n = tl.program_id(1)  # which BLOCK_SIZE_N columns of the output
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return  # past the padded runs: the buffers are sized for the worst routing

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)  # [BM]
    offs_token = tl.load(sorted_token_ids_ptr + offs_m).to(tl.int64)  # [BM] pair ids
    token_mask = offs_token < num_valid_tokens  # [BM] False on padding
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)  # [BN]
    offs_k = tl.arange(0, BLOCK_SIZE_K)  # [BK]

    # A's rows are gathered through the sorted ids; B is the expert's [N, K] read as [K, N].
    a_ptrs = a_ptr + (offs_token[:, None] // top_k) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)  # [BM, BN]
    for k_block in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k_block * BLOCK_SIZE_K
        a = tl.load(
            a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_left), other=0.0
        )  # [BM, BK]
        b = tl.load(
            b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0
        )  # [BK, BN]
        if DOT_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if MUL_ROUTED_WEIGHT:
        weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0.0)  # [BM]
        acc = acc * weight[:, None]
    c_ptrs = c_ptr + offs_token[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = token_mask[:, None] & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def invoke_fused_moe_kernel(
    a: torch.Tensor,  # [rows, K]
    b: torch.Tensor,  # [num_experts, N, K]
    c: torch.Tensor,  # [num_pairs, N], written
    topk_weights: torch.Tensor | None,  # [num_pairs] float32, multiplied in when given
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    top_k: int,  # pairs per row of `a`
    block_sizes: tuple[int, int, int],  # (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
) -> None:
    """One grouped matmul: c[p] = b[expert of p] @ a[p // top_k] (times p's weight) for every
    pair p, one program per (block of sorted pairs, BLOCK_SIZE_N output columns)."""
    block_m, block_n, block_k = block_sizes
    N, K = b.shape[1], b.shape[2]
    interpreted = triton_setup.is_interpreted()
    grid = (expert_ids.shape[0], triton.cdiv(N, block_n))
    fused_moe_kernel[grid](
        a,
        b,
        c,
        topk_weights if topk_weights is not None else c,  # not read without MUL_ROUTED_WEIGHT
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        N,
        K,
        c.shape[0],
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        BLOCK_SIZE_M=block_m,
        BLOCK_SIZE_N=block_n,
        BLOCK_SIZE_K=block_k,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        top_k=top_k,
        # NumPy has no bfloat16, so the interpreter's tl.dot on it is wrong: upcast there.
        DOT_FP32=interpreted and a.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
    )


def default_block_sizes(
    num_pairs: int, num_experts: int, interpreted: bool
) -> tuple[int, int, int]:
    """(BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K), vLLM's untuned defaults: small M tiles when
    experts get few tokens each (decode), so that little of a tile is padding."""
    if interpreted:
        return 16, 32, 32  # tl.dot's smallest M; fewer, larger programs elsewhere
    if num_pairs <= num_experts * 16:
        return 16, 32, 64
    return 64, 64, 32


def fused_experts(
    hidden_states: torch.Tensor,  # [num_tokens, hidden]
    w13: torch.Tensor,  # [num_experts, 2 * intermediate, hidden]: gate rows, then up rows
    w2: torch.Tensor,  # [num_experts, hidden, intermediate]
    topk_weights: torch.Tensor,  # [num_tokens, k] float32
    topk_ids: torch.Tensor,  # [num_tokens, k] int32/int64
    *,
    block_sizes: tuple[int, int, int] | None = None,
) -> torch.Tensor:  # [num_tokens, hidden]
    """Each token's chosen experts, weighted and summed (as `fused_experts_ref`), on Triton.

    `block_sizes` = (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K), each a power of two >= 16
    (tl.dot's smallest); by default `default_block_sizes`.
    """
    interpreted = triton_setup.is_interpreted()
    num_tokens, hidden, num_experts, intermediate, top_k = check_moe_args(
        hidden_states, w13, w2, topk_weights, topk_ids
    )
    checks.check_same_device(
        hidden_states=hidden_states, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids
    )
    checks.check_device_for_mode(hidden_states, interpreted)
    if hidden_states.stride(-1) != 1:
        raise ValueError("hidden_states must be contiguous along hidden (stride(-1) == 1)")
    num_pairs = num_tokens * top_k
    if block_sizes is None:
        block_sizes = default_block_sizes(num_pairs, num_experts, interpreted)
    for name, value in zip(("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"), block_sizes):
        if not (checks.is_power_of_two(value) and value >= 16):
            raise ValueError(f"{name}={value} must be a power of two >= 16")
    if not (hidden_states.is_cuda and torch.cuda.is_current_stream_capturing()):
        check_expert_ids(topk_ids, num_experts)  # reads a value back: not inside a CUDA graph
    if num_tokens == 0:
        return hidden_states.new_empty(0, hidden)

    sorted_token_ids, expert_ids, num_tokens_post_padded = moe_align_block_size(
        topk_ids, block_sizes[0], num_experts
    )
    dtype, device = hidden_states.dtype, hidden_states.device
    cache1 = torch.empty(num_pairs, 2 * intermediate, dtype=dtype, device=device)
    invoke_fused_moe_kernel(
        hidden_states,
        w13,
        cache1,
        None,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        top_k,
        block_sizes,
    )
    gate, up = cache1.float().split(intermediate, dim=1)
    cache2 = (F.silu(gate) * up).to(dtype)  # [num_pairs, intermediate], rounded once
    cache3 = torch.empty(num_pairs, hidden, dtype=dtype, device=device)
    invoke_fused_moe_kernel(
        cache2,
        w2,
        cache3,
        topk_weights.float().flatten(),
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        1,
        block_sizes,
    )
    return cache3.view(num_tokens, top_k, hidden).sum(dim=1)
