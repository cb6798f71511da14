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
from torch import nn

from nanovllm.distributed.expert_parallel import expert_parallel_experts, local_expert_range
from nanovllm.distributed.parallel_state import get_tp_rank, get_tp_world_size
from nanovllm.models.linear import LoadedWeight, check_shape, new_parameter
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.moe import FusedMoE, SparseMoeBlock, fused_experts, select_experts


class ExpertParallelFusedMoE(FusedMoE):
    """`FusedMoE` with this rank's experts whole (see the module docstring):
    x [num_tokens, hidden] -> [num_tokens, hidden], the same on every rank."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        nn.Module.__init__(self)
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.intermediate_size_per_partition = intermediate_size  # (every expert here is whole)
        self.local_experts = local_expert_range(num_experts, self.tp_rank, self.tp_size)
        n, size = len(self.local_experts), intermediate_size
        self.w13_weight = new_parameter(
            n, 2 * size, hidden_size, dtype=params_dtype, weight_loader=self.weight_loader
        )
        self.w2_weight = new_parameter(
            n, hidden_size, size, dtype=params_dtype, weight_loader=self.weight_loader
        )
        # Only this rank's experts' tensors are expected (the loader checks none is missing).
        self.w13_weight.shard_ids = [(e, w) for e in self.local_experts for w in ("w1", "w3")]
        self.w2_weight.shard_ids = [(e, "w2") for e in self.local_experts]
        self.expert_load = torch.zeros(num_experts, dtype=torch.int64)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: tuple[int, str]
    ) -> None:
        """One expert's full matrix into its local place; another rank's expert is skipped."""
        expert, matrix = shard_id
        if not 0 <= expert < self.num_experts or matrix not in ("w1", "w2", "w3"):
            raise ValueError(
                f"FusedMoE: shard {shard_id!r} is not (expert in 0..{self.num_experts - 1}, "
                "'w1' | 'w2' | 'w3')"
            )
        if expert not in self.local_experts:
            return
        local, size = expert - self.local_experts.start, self.intermediate_size
        if matrix == "w2":
            check_shape(f"FusedMoE expert {expert} w2", loaded_weight, (self.hidden_size, size))
            param.data[local].copy_(loaded_weight.narrow(0, 0, self.hidden_size))  # (read whole)
            return
        check_shape(f"FusedMoE expert {expert} {matrix}", loaded_weight, (size, self.hidden_size))
        rows = param.data[local].narrow(0, 0 if matrix == "w1" else size, size)
        rows.copy_(loaded_weight.narrow(0, 0, size))

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
