"""AttentionPlans: the CPU paged-attention work that depends only on the step, done once a step.

Every layer of a step attends with the same metadata (block tables, sequence lengths, query
starts). Before the kernel can run, its wrapper checks that metadata, copies it into int32 numpy
arrays, checks every block id the batch reads and splits the queries into work items
(`plan_paged_attention_cpu`): tens of microseconds of Python per call, the same answer in every
layer. vLLM's CPU backend does that work once per step, when its `CPUAttentionMetadataBuilder`
builds the step's metadata; here the first layer that attends with a step's metadata makes the
plan, and the layers after it reuse it (`paged_attention_cpu_planned`).

What a plan is keyed by: the step's three metadata tensors, by identity, and what else the plan
depends on (the cache's shape, the query's size, the layer's sliding window, torch's thread
count). A new step brings new tensors (`InputBatch` and `step_inputs` build them afresh each
step, and a step's metadata is not rewritten in place), so it never finds an old plan; layers of
different windows or KV cache groups get their own. The cache holds the tensors of the plans it
keeps, so their ids cannot be given to other tensors while they are keys, and forgets every plan
when it holds `MAX_PLANS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nanovllm.kernels.cpu_paged_attention import plan_paged_attention_cpu
from nanovllm.models.attention import AttentionMetadata

if TYPE_CHECKING:  # (numba is optional: the plan's type is only named here)
    from nanovllm.kernels.cpu_paged_attention_numba import AttentionPlan

# Plans kept at most: a step needs one per (KV cache group, sliding window) of its layers.
MAX_PLANS = 16


class AttentionPlans:
    """The plans of the steps being run, shared by every layer of a model."""

    def __init__(self) -> None:
        # key -> (the metadata tensors the key names by id, their plan)
        self._plans: dict[tuple, tuple[tuple[torch.Tensor, ...], AttentionPlan]] = {}

    def plan(
        self,
        meta: AttentionMetadata,
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        num_tokens: int,
        num_heads: int,
        sliding_window: int | None,
    ) -> AttentionPlan:
        """The plan for `meta`, made by the first call with this step and configuration."""
        tensors = (meta.block_tables, meta.seq_lens, meta.query_start_loc)
        key = (
            *map(id, tensors),
            key_cache.shape,
            num_tokens,
            num_heads,
            sliding_window,
            torch.get_num_threads(),
        )
        entry = self._plans.get(key)
        if entry is not None:
            return entry[1]
        plan = plan_paged_attention_cpu(
            key_cache,
            *tensors,
            num_tokens,
            num_heads,
            sliding_window=sliding_window,
        )
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[key] = (tensors, plan)
        return plan

    def __len__(self) -> int:
        return len(self._plans)
