"""KVCacheCoordinator: one request's blocks across every KV cache group, as one decision.

A model whose layers keep different KV (full attention beside sliding windows,
`kv_cache_interface.py`) has one `SingleTypeKVCacheManager` per KV cache group, all taking
blocks from one `BlockPool`. The coordinator asks each for its share, so a request is given its
blocks in every group or in none:

- allocating: blocks out of every window first (`remove_skipped_blocks`), then the sum over
  groups of the blocks to take, checked against the free queue once, then each group's taken;
- a prefix-cache hit: a length every group can serve. A full-attention group's hit is any
  prefix of its longest; a sliding group's at a shorter length needs other blocks (the window
  before that length), so each group is asked again at the shortest length found so far, until
  all agree;
- freeing, and caching full blocks: every group.

With one group (every model without windows) each call is that group's manager's.
"""

from __future__ import annotations

from nanovllm.core.block_pool import BlockPool
from nanovllm.core.free_block_queue import KVCacheBlock
from nanovllm.core.kv_cache_interface import KVCacheConfig, KVCacheSpec, SlidingWindowSpec
from nanovllm.core.single_type_kv_cache_manager import (
    FullAttentionManager,
    SingleTypeKVCacheManager,
)
from nanovllm.core.sliding_window_manager import SlidingWindowManager
from nanovllm.events import EventBus
from nanovllm.request import Request

BlocksPerGroup = tuple[list[KVCacheBlock], ...]  # one list per group (`KVCacheBlocks` holds one)


class KVCacheCoordinator:
    def __init__(self, kv_cache_config: KVCacheConfig, block_pool: BlockPool, events: EventBus,
                 sliding_window_manager: type | None = None) -> None:  # fmt: skip
        self.kv_cache_config, self.block_pool = kv_cache_config, block_pool
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            manager_for(group.kv_cache_spec, block_pool, group_id, events, sliding_window_manager)
            for group_id, group in enumerate(kv_cache_config.kv_cache_groups)
        )
        self.sliding_window_managers = [
            m for m in self.single_type_managers if isinstance(m.kv_cache_spec, SlidingWindowSpec)
        ]

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: BlocksPerGroup
    ) -> int:
        """Blocks the request takes from the free queue, every group together."""
        num_blocks = 0
        for manager, hits in zip(self.single_type_managers, new_computed_blocks):
            num_blocks += manager.get_num_blocks_to_allocate(request_id, num_tokens, hits)
        return num_blocks

    def save_new_computed_blocks(self, request_id: str, new_computed_blocks: BlocksPerGroup):
        for manager, hits in zip(self.single_type_managers, new_computed_blocks):
            manager.save_new_computed_blocks(request_id, hits)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> BlocksPerGroup:
        """Every group's new blocks for `num_tokens` tokens."""
        return tuple([m.allocate_new_blocks(request_id, num_tokens)
                      for m in self.single_type_managers])  # fmt: skip

    def cache_blocks(self, request: Request, block_hashes: list[bytes], num_full: int) -> None:
        for manager in self.single_type_managers:
            manager.cache_blocks(request, block_hashes, num_full)

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> bool:
        """Every sliding group frees the blocks its attention will not read again (a full
        group never has any)."""
        removed = False
        for manager in self.sliding_window_managers:
            removed |= manager.remove_skipped_blocks(request_id, num_computed_tokens)
        return removed

    def find_longest_cache_hit(
        self, request: Request, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlocksPerGroup, int]:
        """Each group's hit blocks, and the tokens they cover: the longest length that every
        group can serve (see the module docstring)."""
        hits: list[list[KVCacheBlock]] = []
        length = max_length
        while True:
            hits = [m.find_longest_cache_hit(request, block_hashes, length)
                    for m in self.single_type_managers]  # fmt: skip
            shortest = min(len(h) for h in hits) * self.block_size
            if all(len(h) * self.block_size == shortest for h in hits):
                return tuple(hits), shortest
            length = shortest  # (shorter each time: it ends)

    def get_block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        """The request's block table in every group."""
        return tuple(
            tuple(b.block_id for b in m.req_to_blocks.get(request_id, ()))
            for m in self.single_type_managers
        )


def manager_for(
    spec: KVCacheSpec, block_pool: BlockPool, group_id: int, events: EventBus, sliding: type | None
) -> SingleTypeKVCacheManager:
    """The manager of one group, by its spec's type (a sliding one: `sliding`, lesson 16's)."""
    cls = (sliding or SlidingWindowManager) if isinstance(spec, SlidingWindowSpec) else None
    return (cls or FullAttentionManager)(spec, block_pool, group_id, events)
