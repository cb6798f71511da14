"""A mixture of experts' step as an event: how many tokens each expert received, and where.

Every `FusedMoE` layer keeps `expert_load`, the tokens its router sent to each expert in its
last forward pass (`models/moe.py`). Right after a step's forward pass, `expert_loads` holds
that step's counts; `expert_loads_event` turns them into an `ExpertLoads` event, for whoever
watches where the work went (the visualizer's `moe` scenario). Rank 0's layers suffice: the
router is replicated, so every rank counts the same tokens for every expert, and with expert
parallelism each expert's rank follows from `local_expert_range`.

Which layers are sparse is found once, when the engine is built (`ExpertLoadReader`): a dense
model has no such layer, so its reader reads nothing and makes no event, at no cost per step.
"""

from __future__ import annotations

import torch
from torch import nn

from nanovllm.events import ExpertLoads
from nanovllm.models.moe import expert_loads


class ExpertLoadReader:
    """`model`'s sparse decoder layers, found once; `read()` gives their `expert_load`s after a
    forward pass, `event(step, loads)` turns them into an `ExpertLoads` event."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layers = tuple(expert_loads(model))  # indices of the sparse layers; () when dense

    def read(self) -> dict[int, torch.Tensor]:
        """Each sparse layer's tokens per expert in the last forward pass: {layer: [num_experts]}."""
        layers = self.model.model.layers
        return {i: layers[i].mlp.experts.expert_load for i in self.layers}

    def event(self, step: int, loads: dict[int, torch.Tensor] | None = None) -> ExpertLoads | None:
        """`step`'s loads as an event (`loads`: as `read()` gave them right after the step's
        forward pass; None: read them now). None for a dense model."""
        if not self.layers:
            return None
        loads = self.read() if loads is None else loads
        # Imported here: a dense model's engine loads nothing of expert parallelism (which brings in
        # the kernels' references), as the plain backend's test checks.
        from nanovllm.distributed.expert_parallel import local_expert_range
        from nanovllm.models.moe_expert_parallel import ExpertParallelFusedMoE

        moe = self.model.model.layers[self.layers[0]].mlp.experts  # (every sparse layer alike)
        ranks: tuple[int, ...] = ()
        if isinstance(moe, ExpertParallelFusedMoE):
            ranks = tuple(
                rank
                for rank in range(moe.tp_size)
                for _ in local_expert_range(moe.num_experts, rank, moe.tp_size)
            )
        return ExpertLoads(
            step=step,
            top_k=moe.top_k,
            layers=tuple(loads),
            counts=tuple(tuple(int(n) for n in load.tolist()) for load in loads.values()),
            expert_ranks=ranks,
        )
