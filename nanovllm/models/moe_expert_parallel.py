"""Expert parallelism: each rank holds some of a layer's experts, whole, instead of a slice of
every expert.

With tensor parallelism alone (`moe.py`'s `FusedMoE`), every rank holds every expert and cuts
each one's intermediate dimension, as the dense MLP's layers are cut. With expert parallelism
(vLLM's `enable_expert_parallel=True`), rank r of R holds experts
`local_expert_range(E, r, R)` whole: a contiguous run of E / R of them (the first E % R ranks one
more). Attention stays tensor-parallel, so every rank has every token; each rank routes them
alike, runs the (token, expert) pairs whose expert it holds, and one all-reduce adds the ranks'
partial outputs (`distributed/expert_parallel.py` says why that collective, and when an
all-to-all is the better one). The layer's memory per rank is the same as under tensor
parallelism; what changes is the work: a rank's experts run whole matmuls over only their own
tokens, so an expert that receives many tokens keeps its rank busy (`expert_load` shows it).

`expert_parallel_layers` is the picklable `model_layers` callable the engine gives every rank
when `enable_expert_parallel` is set (`engine/setup.py`).
"""

from __future__ import annotations

import dataclasses

import torch

from nanovllm.distributed.expert_parallel import expert_parallel_experts, local_expert_range
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.moe import FusedMoE, SparseMoeBlock, fused_experts, select_experts


class ExpertParallelFusedMoE(FusedMoE):
    """`FusedMoE` with this rank's experts whole (see the module docstring):
    x [num_tokens, hidden] -> [num_tokens, hidden], the same on every rank."""

    def partition(self) -> tuple[range, int, int]:
        """This rank's contiguous run of experts, each whole."""
        experts = local_expert_range(self.num_experts, self.tp_rank, self.tp_size)
        return experts, 0, self.intermediate_size

    def forward(
        self,
        hidden_states: torch.Tensor,  # [num_tokens, hidden]
        router_logits: torch.Tensor,  # [num_tokens, num_experts]
    ) -> torch.Tensor:  # [num_tokens, hidden]
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        self.expert_load = torch.bincount(topk_ids.flatten(), minlength=self.num_experts)
        # (already all-reduced: every rank's experts' share of every token)
        return expert_parallel_experts(
            hidden_states,
            self.w13_weight,
            self.w2_weight,
            topk_weights,
            topk_ids,
            self.local_experts.start,
            experts_fn=fused_experts,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, local_experts={self.local_experts}"


class ExpertParallelMoeBlock(SparseMoeBlock):
    """`SparseMoeBlock` over `ExpertParallelFusedMoE`."""

    fused_moe_class = ExpertParallelFusedMoE


def expert_parallel_layers(attention: type) -> ModelLayers:
    """The engine's layers with expert-parallel mixtures of experts (a `model_layers`)."""
    return dataclasses.replace(ModelLayers(attention), moe=ExpertParallelMoeBlock)
