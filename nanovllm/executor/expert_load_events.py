"""A mixture of experts' step as an event: how many tokens each expert received, and where.

Every `FusedMoE` layer keeps `expert_load`, the tokens its router sent to each expert in its
last forward pass (`models/moe.py`). Right after a step's forward pass, `expert_loads` holds
that step's counts; `expert_loads_event` turns them into an `ExpertLoads` event, for whoever
watches where the work went (the visualizer's `moe` scenario). Rank 0's layers suffice: the
router is replicated, so every rank counts the same tokens for every expert, and with expert
parallelism each expert's rank follows from `local_expert_range`.

A dense model has no such layer, and no event is made for it.
"""

from __future__ import annotations

import torch
from torch import nn

from nanovllm.events import ExpertLoads
from nanovllm.models.moe import expert_loads


def expert_loads_event(
    step: int, model: nn.Module, loads: dict[int, torch.Tensor] | None = None
) -> ExpertLoads | None:
    """`model`'s expert loads of `step` (`loads`: as `expert_loads(model)` gave them right
    after the step's forward pass; None: read them now). None for a dense model."""
    loads = expert_loads(model) if loads is None else loads
    if not loads:
        return None
    # Imported here: a dense model's engine loads nothing of expert parallelism (which brings in
    # the kernels' references), as the plain backend's test checks.
    from nanovllm.distributed.expert_parallel import local_expert_range
    from nanovllm.models.moe_expert_parallel import ExpertParallelFusedMoE

    moe = model.model.layers[next(iter(loads))].mlp.experts  # (every sparse layer alike)
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
