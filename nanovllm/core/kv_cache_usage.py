"""How full the KV cache is: the slots its used blocks hold, and of them those holding a token's KV.

Paging wastes at most a block's tail per request (`kv_cache_manager.py`); these two figures show
how much it wastes now (1 - filled / allocated). They are read for the engine's statistics and
its `StepSummary` events, never by a step, so they are counted when asked, from the managers'
tables, and no step pays for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanovllm.core.kv_cache_manager import KVCacheManager


def num_allocated_slots(kv: KVCacheManager) -> int:
    """Slots in used blocks."""
    return kv.num_used_blocks * kv.block_size


def num_filled_slots(kv: KVCacheManager) -> int:
    """Of them, slots that hold a token's KV: in each KV cache group, each block in a table once
    (a block shared by several requests, a prefix-cache hit, is counted once; the null block not
    at all), holding the request's tokens that fall in it."""
    bs, null = kv.block_size, kv.block_pool.null_block
    filled = 0
    for manager in kv.coordinator.single_type_managers:
        seen: set[int] = set()
        for req_id, blocks in manager.req_to_blocks.items():
            num_tokens = kv.req_num_filled_slots.get(req_id, 0)  # tokens given slots
            for i, block in enumerate(blocks):
                if block is null or block.block_id in seen:
                    continue
                seen.add(block.block_id)
                filled += min(max(num_tokens - i * bs, 0), bs)
    return filled
