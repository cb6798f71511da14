"""Lesson 02 reference: the engine's block allocation and slot mapping.

- `blocks_needed`: asks the engine's `KVCacheManager` to allocate a request of `num_tokens`
  tokens and counts the blocks in its block table.
- `slot_mapping` / `slot_for`: hand a one-request `SchedulerOutput` to the model runner's
  `step_inputs`, which builds a step's inputs, slot mapping included, from scratch (the plain
  version of what the CPU and GPU backends' `InputBatch` computes every step; no model is loaded).
"""

from __future__ import annotations

from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.scheduler import ScheduledRequest, SchedulerOutput
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

__all__ = ["blocks_needed", "slot_for", "slot_mapping"]


def _request(num_tokens: int, request_id: str = "r") -> Request:
    return Request(request_id, list(range(num_tokens)), SamplingParams(), arrival_index=0)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    kv = KVCacheManager(num_tokens // block_size + 1, block_size, enable_prefix_caching=False)
    request = _request(num_tokens)
    assert kv.allocate_slots(request, num_tokens) is not None
    return len(kv.get_block_table(request.request_id))


def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    if end <= start:
        return []
    step = SchedulerOutput(
        step=1,
        scheduled=[
            ScheduledRequest(
                request=_request(end),
                num_new_tokens=end - start,
                num_computed_tokens=start,
                block_tables=(list(block_table),),
                samples=True,
                is_prefill=end - start > 1,
            )
        ],
    )
    _, _, meta, _ = step_inputs(step, block_size)
    return meta.slot_mapping.tolist()


def slot_for(block_table: list[int], position: int, block_size: int) -> int:
    return slot_mapping(block_table, position, position + 1, block_size)[0]
