"""The mixture-of-experts layer on a CPU: the tokens sorted by expert once, two grouped matmuls.

The plain layer (`models/moe.py`'s `fused_experts`) loops over the experts in Python and, for
each one that received tokens, gathers its rows, runs its two matmuls, the SiLU gate and the
weighting, and adds the result into the output: about ten torch calls per expert. A decode step
has few tokens, so each of those calls does little work and their overhead is most of the
layer's time. Here the per-expert work is the matmuls alone:

    pairs sorted by expert (one argsort)      x_sorted = x[token of each pair]   [n * k, H]
    gate_up = x_sorted @ w13_e^T per group   (one grouped matmul)               [n * k, 2I]
    act = silu(gate) * up                    (one call over every row)          [n * k, I]
    y_sorted = act @ w2_e^T per group        (one grouped matmul)               [n * k, H]
    out[t] = sum over t's k pairs of weight * y                                 [n, H]

The grouped matmul is torch's `F.grouped_mm` (one call over all groups) where this torch has
it and the step has at least as many (token, expert) pairs as there are experts; else one
`torch.mm` per expert that received tokens, written straight into its rows of the output.
`F.grouped_mm` visits every expert, empty or not, so for a decode step of one token over 128
experts the loop, which skips the empty ones, was faster (nanovllm/bench/README.md).

It computes what `fused_experts` computes, summing each token's k results in slot order
rather than expert order (so equal to rounding: tests/test_moe.py). Its speed against the plain
layer: nanovllm/bench/README.md ("Mixture of experts on a CPU").
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.moe import FusedMoE, SparseMoeBlock, sort_by_expert


def grouped_linear(
    x: torch.Tensor,  # [m, in]: rows grouped by expert, `counts[e]` rows for expert e, in order
    weight: torch.Tensor,  # [num_experts, out, in]
    counts: list[int],  # [num_experts]
    use_grouped_mm: bool,
) -> torch.Tensor:  # [m, out]: each group's rows times its expert's weight^T
    """Each group of rows times its own expert's weight."""
    if use_grouped_mm:
        ends = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
        return F.grouped_mm(x, weight.transpose(1, 2), offs=ends)
    out = x.new_empty(x.shape[0], weight.shape[1])
    start = 0
    for expert, count in enumerate(counts):
        if count:
            rows = slice(start, start + count)
            torch.mm(x[rows], weight[expert].t(), out=out[rows])
            start += count
    return out


def cpu_fused_experts(
    hidden_states: torch.Tensor,  # [num_tokens, hidden]
    w13_weight: torch.Tensor,  # [num_experts, 2 * intermediate, hidden]
    w2_weight: torch.Tensor,  # [num_experts, hidden, intermediate]
    topk_weights: torch.Tensor,  # [num_tokens, top_k]
    topk_ids: torch.Tensor,  # [num_tokens, top_k]
    use_grouped_mm: bool | None = None,
) -> torch.Tensor:  # [num_tokens, hidden]
    """`fused_experts` with the pairs sorted once and two grouped matmuls (module docstring).
    `use_grouped_mm`: True or False forces `F.grouped_mm` or the loop; None picks as above."""
    num_tokens, top_k = topk_ids.shape
    intermediate = w2_weight.shape[2]
    num_experts = w13_weight.shape[0]
    if use_grouped_mm is None:
        use_grouped_mm = topk_ids.numel() >= num_experts
    use_grouped_mm = use_grouped_mm and hasattr(F, "grouped_mm")
    order, expert_counts = sort_by_expert(topk_ids, num_experts)  # [n * k], [num_experts]
    counts = expert_counts.tolist()
    x = hidden_states.index_select(0, order // top_k)  # [n * k, hidden]
    gate_up = grouped_linear(x, w13_weight, counts, use_grouped_mm)  # [n * k, 2 * intermediate]
    act = F.silu(gate_up[:, :intermediate]).mul_(gate_up[:, intermediate:])
    y = grouped_linear(act, w2_weight, counts, use_grouped_mm)  # [n * k, hidden]
    y.mul_(topk_weights.reshape(-1)[order].unsqueeze(1).to(y.dtype))
    # Back to (token, slot) order, then each token's k results summed.
    unsorted = torch.empty_like(y)
    unsorted[order] = y
    return unsorted.view(num_tokens, top_k, -1).sum(dim=1)


class CpuFusedMoE(FusedMoE):
    """`FusedMoE` with its experts run by `cpu_fused_experts`."""

    def apply(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return cpu_fused_experts(
            hidden_states, self.w13_weight, self.w2_weight, topk_weights, topk_ids
        )


class CpuSparseMoeBlock(SparseMoeBlock):
    """`SparseMoeBlock` whose experts are `CpuFusedMoE`."""

    fused_moe_class = CpuFusedMoE


def moe_layers(layers: ModelLayers) -> ModelLayers:
    """`layers` with the plain mixture-of-experts block replaced by the CPU one."""
    if layers.moe is not SparseMoeBlock:
        return layers
    return dataclasses.replace(layers, moe=CpuSparseMoeBlock)
