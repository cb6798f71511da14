"""What each rank runs in the expert-parallel tests: its slice of the experts, then the combine.

The test process (rank 0) sends the full weights and the routing to every rank; each rank keeps
the experts it holds (`local_expert_weights`) and calls `expert_parallel_experts`, whose
all-reduce meets the other rank's. The test compares every rank's output with the reference run
alone on all the experts.

Imported by the spawned worker process (the factory is pickled by reference), so it lives beside
the tests rather than inside them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nanovllm.distributed import get_tp_rank, get_tp_world_size
from nanovllm.distributed.expert_parallel import (
    expert_parallel_experts,
    local_expert_range,
    local_expert_weights,
)
from nanovllm.kernels.fused_moe_reference import fused_experts_ref


class ExpertParallelChecks:
    def __init__(self, rank: int) -> None:
        assert get_tp_rank() == rank
        self.rank = rank

    def experts(
        self,
        hidden_states: torch.Tensor,
        w13: torch.Tensor,  # [num_experts, 2 * intermediate, hidden]: all of them
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        kernel: str = "reference",  # or "triton" (the interpreter here)
        explicit_group: bool = False,  # pass torch's world group rather than None
    ) -> torch.Tensor:
        rank, size = get_tp_rank(), get_tp_world_size()
        if kernel == "triton":
            from nanovllm.kernels.fused_moe import fused_experts as experts_fn
        else:
            experts_fn = fused_experts_ref
        return expert_parallel_experts(
            hidden_states,
            local_expert_weights(w13, rank, size),
            local_expert_weights(w2, rank, size),
            topk_weights,
            topk_ids,
            local_expert_range(w13.shape[0], rank, size).start,
            group=dist.group.WORLD if explicit_group else None,
            experts_fn=experts_fn,
        )
