"""Plain-torch reference for a mixture of experts' expert computation: the oracle for fused_moe.

A mixture-of-experts layer replaces one MLP with `num_experts` of them. A router (not here: it is
the model's, and each architecture has its own rule) picks `k` experts for every token and a
weight for each. This module computes what the experts then do:

    out[t] = sum over j < k of  topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])
    expert_e(x) = w2[e] @ (silu(gate_e @ x) * (up_e @ x))     (a SwiGLU MLP, as Llama's)

with every expert's gate and up projections stacked in one tensor, gate rows first, as vLLM
stores them (`w13`):

    w13: [num_experts, 2 * intermediate, hidden]   rows 0..I-1 = gate_e, rows I..2I-1 = up_e
    w2:  [num_experts, hidden, intermediate]

It is written to be obviously correct, not fast: one loop over experts, each gathering the tokens
routed to it (the same grouping the Triton kernel does by sorting), computing in float32 and
rounding the output once. A token that lists one expert twice gets it twice, weighted each time.
It is tested against a dense oracle that runs every expert on every token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_moe_args(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> tuple[int, int, int, int, int]:
    """Check the shapes and dtypes `fused_experts` takes; returns
    (num_tokens, hidden, num_experts, intermediate, top_k)."""
    if hidden_states.dim() != 2:
        raise ValueError(
            f"hidden_states must be [num_tokens, hidden], got {tuple(hidden_states.shape)}"
        )
    num_tokens, hidden = hidden_states.shape
    if w13.dim() != 3 or w13.shape[2] != hidden or w13.shape[1] % 2:
        raise ValueError(
            f"w13 must be [num_experts, 2 * intermediate, hidden={hidden}], got {tuple(w13.shape)}"
        )
    num_experts, intermediate = w13.shape[0], w13.shape[1] // 2
    if num_experts < 1:
        raise ValueError("w13 holds no expert (num_experts = 0)")
    if tuple(w2.shape) != (num_experts, hidden, intermediate):
        raise ValueError(
            f"w2 must be [num_experts, hidden, intermediate] = "
            f"{(num_experts, hidden, intermediate)}, got {tuple(w2.shape)}"
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != num_tokens or topk_ids.shape[1] < 1:
        raise ValueError(
            f"topk_ids must be [num_tokens={num_tokens}, k >= 1], got {tuple(topk_ids.shape)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, "
            f"got {tuple(topk_weights.shape)}"
        )
    if not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be floating point, got {topk_weights.dtype}")
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype != hidden_states.dtype:
            raise ValueError(f"{name} is {w.dtype} but hidden_states is {hidden_states.dtype}")
    return num_tokens, hidden, num_experts, intermediate, topk_ids.shape[1]


def check_expert_ids(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Every routed id names one of the `num_experts` experts (reads the ids: a device sync)."""
    if topk_ids.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(topk_ids)).tolist()  # one read back, not two
    if low < 0 or high >= num_experts:
        bad = low if low < 0 else high
        raise ValueError(f"topk_ids holds expert {bad}, outside 0..{num_experts - 1}")


def fused_experts_ref(
    hidden_states: torch.Tensor,  # [num_tokens, hidden]
    w13: torch.Tensor,  # [num_experts, 2 * intermediate, hidden]: gate rows, then up rows
    w2: torch.Tensor,  # [num_experts, hidden, intermediate]
    topk_weights: torch.Tensor,  # [num_tokens, k] the router's weight of each chosen expert
    topk_ids: torch.Tensor,  # [num_tokens, k] int: which experts each token chose
) -> torch.Tensor:  # [num_tokens, hidden]
    """Each token's chosen experts, weighted and summed."""
    num_tokens, hidden, num_experts, intermediate, _ = check_moe_args(
        hidden_states, w13, w2, topk_weights, topk_ids
    )
    check_expert_ids(topk_ids, num_experts)
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=hidden_states.device)
    for e in range(num_experts):
        # The (token, choice) pairs routed to expert e.
        tokens, choice = (topk_ids == e).nonzero(as_tuple=True)  # [n_e], [n_e]
        if tokens.numel() == 0:
            continue  # an expert no token chose costs nothing
        x = hidden_states[tokens].float()  # [n_e, hidden]
        gate_up = x @ w13[e].float().T  # [n_e, 2 * intermediate]
        act = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]  # [n_e, intermediate]
        y = act @ w2[e].float().T  # [n_e, hidden]
        weight = topk_weights[tokens, choice].float()  # [n_e]
        out.index_put_((tokens,), y * weight[:, None], accumulate=True)
    return out.to(hidden_states.dtype)
