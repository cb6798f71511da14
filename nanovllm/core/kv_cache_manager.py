"""KVCacheManager: who owns which block of the paged KV cache.

This is PagedAttention's bookkeeping, all on the CPU. The cache itself (the big K/V tensors) lives
with the model executor; here we only decide which physical block holds which request's tokens.

- A request's `block_table` lists its physical block ids; logical block i (its tokens
  i*block_size ... (i+1)*block_size - 1) lives in physical block `block_table[i]`, so token t goes
  to slot `block_table[t // block_size] * block_size + t % block_size`.
- A request grows one block at a time, and only when its last block is full, so at most
  block_size - 1 slots per request are ever wasted (internal fragmentation).
- Blocks are reference counted. With prefix caching on, a full block is registered under a hash
  of its tokens and everything before them (`block_hash.py`); a new request whose prompt starts
  with the same full blocks reuses them instead of computing them again.
- Freed blocks keep their hash in the free queue until handed out again (lazy LRU eviction,
  `free_block_queue.py`); a request's go back tail first, so its shareable start is evicted last.

As vLLM v1 splits the work: the blocks themselves, the free queue, the hash map and eviction are
the `BlockPool`'s (`block_pool.py`); each KV cache group's block tables are its
`SingleTypeKVCacheManager`'s (`single_type_kv_cache_manager.py`: full attention, or a sliding
window, which frees blocks its window has left behind), and the `KVCacheCoordinator` asks every
group at once (`kv_cache_coordinator.py`). This manager is what the scheduler calls: a request's
prefix-cache hit, room for its next tokens, and its blocks back. Blocks cross that boundary as
`KVCacheBlocks`, one list per group always (vLLM's). A model without windows has one group, and
each request one block table.

Taking, returning and cache-hitting a block cost O(1) each (no list scans), so `allocate_slots`
and `free` cost O(blocks they take or return). Each request's block ids are kept as tuples
(`block_tables`), rebuilt only after its blocks change: an unchanged table costs one dict lookup
and is the very same object as last step's (the persistent batch checks that identity first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nanovllm.core.block_hash import extend_block_hashes
from nanovllm.core.block_pool import BlockPool
from nanovllm.core.free_block_queue import FreeBlockQueue, KVCacheBlock
from nanovllm.core.kv_cache_coordinator import KVCacheCoordinator
from nanovllm.core.kv_cache_interface import KVCacheConfig, single_group_config
from nanovllm.events import EventBus
from nanovllm.request import Request


@dataclass(slots=True)
class KVCacheBlocks:
    """Blocks as the manager hands them to the scheduler: `blocks[g][i]` is block i in KV cache
    group g (one list per group, however many groups there are)."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        """The blocks' ids, one list per group."""
        return tuple([block.block_id for block in group] for group in self.blocks)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        events: EventBus | None = None,
        free_block_queue: Callable[[list[KVCacheBlock]], FreeBlockQueue] = FreeBlockQueue,
        kv_cache_config: KVCacheConfig | None = None,  # None: one group, full attention
        sliding_window_manager: type | None = None,  # None: the engine's (lesson 16's own)
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.events = events or EventBus()
        config = kv_cache_config or single_group_config(1, block_size)
        if config.has_sliding_window and num_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 with a sliding window, got {num_blocks}")
        # The blocks, the free queue (a lesson gives its own), the hash map, this step's changes.
        self.block_pool = pool = BlockPool(
            num_blocks, self.events, free_block_queue, with_null_block=config.has_sliding_window
        )
        self.blocks, self.cached_block_hash_to_block = pool.blocks, pool.cached_block_hash_to_block
        # Each group's block tables, asked as one.
        self.coordinator = KVCacheCoordinator(config, pool, self.events, sliding_window_manager)
        self.num_groups = config.num_groups
        # No blocks, one object for every call that finds or takes none (as vLLM keeps it).
        self.empty_kv_cache_blocks = KVCacheBlocks(((),) * config.num_groups)
        # Per request: the hashes of its full blocks so far (every group's), how many of its
        # blocks are registered in the cache, and how many slots hold tokens.
        self.req_to_block_hashes: dict[str, list[bytes]] = {}
        self.req_num_cached_blocks: dict[str, int] = {}
        self.req_num_filled_slots: dict[str, int] = {}
        # Per request: its block ids in every group, as tuples, built on first read after a
        # change (`block_tables`); every method here that changes a request's blocks drops them.
        self.req_to_block_ids: dict[str, tuple[tuple[int, ...], ...]] = {}

    # --- queries ----------------------------------------------------------------------------

    @property
    def req_to_blocks(self) -> dict[str, list[KVCacheBlock]]:
        """Each request's blocks in the first group (a model without windows: its only one)."""
        return self.coordinator.single_type_managers[0].req_to_blocks

    @property
    def free_block_queue(self) -> FreeBlockQueue:
        return self.block_pool.free_block_queue

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.block_pool.num_used_blocks

    def get_block_table(self, request_id: str) -> list[int]:
        """The request's physical block ids in the first group, in logical order (a new list)."""
        return list(self.block_tables(request_id)[0])

    def block_tables(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        """The request's physical block ids in every group, in logical order: the same tuples
        until its blocks change."""
        ids = self.req_to_block_ids.get(request_id)
        if ids is None:
            if request_id not in self.req_to_blocks:
                return ((),) * self.num_groups  # (not kept: it holds no blocks)
            ids = self.req_to_block_ids[request_id] = self.coordinator.get_block_ids(request_id)
        return ids

    # --- prefix cache lookup ----------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest run of cached full blocks that starts `request`'s tokens.

        Returns the blocks (one list per group) and how many tokens they cover. At least one
        token is always left to compute: the step must end on a forward pass that gives the next
        logits. Nothing is allocated or referenced here (`allocate_slots` does that). A request
        that asks for prompt logprobs reads nothing: each prompt token's logits are computed.
        """
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return self.empty_kv_cache_blocks, 0
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        extend_block_hashes(hashes, request.all_token_ids, self.block_size, request.num_tokens)
        hits, num_tokens = self.coordinator.find_longest_cache_hit(
            request, hashes, request.num_tokens - 1
        )
        return KVCacheBlocks(hits), num_tokens

    # --- allocation -------------------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> int:
        """How many blocks `allocate_slots` takes from the free queue for `num_new_tokens` slots
        (vLLM's name), every group together: new blocks, and prefix-cache hits on free blocks."""
        hits = (new_computed_blocks or self.empty_kv_cache_blocks).blocks
        num_computed = request.num_computed_tokens + len(hits[0]) * self.block_size
        return self.coordinator.get_num_blocks_to_allocate(
            request.request_id, num_computed + num_new_tokens, hits
        )

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        """Make room for `num_new_tokens` more tokens of `request` (after its computed ones).

        `new_computed_blocks` are prefix-cache hits from `get_computed_blocks` for a request
        being admitted. `num_lookahead_tokens` more slots are reserved past the new tokens, for a
        draft model to write its own KV of the tokens it proposes after this step (vLLM's
        argument of the same name); they are never cached. Returns the newly taken blocks (one
        list per group), or None (and takes nothing, though blocks out of its windows are given back) when there
        are not enough free blocks: the scheduler then preempts someone or waits.
        """
        hits = (new_computed_blocks or self.empty_kv_cache_blocks).blocks
        req_id = request.request_id
        num_computed = request.num_computed_tokens + len(hits[0]) * self.block_size
        total_tokens = num_computed + num_new_tokens
        # Blocks out of every window from here on go back first (a sliding group's).
        if self.coordinator.remove_skipped_blocks(req_id, num_computed):
            self.req_to_block_ids.pop(req_id, None)
        num_new_slots = num_new_tokens + num_lookahead_tokens
        num_to_take = self.get_num_blocks_to_allocate(request, num_new_slots, new_computed_blocks)
        if num_to_take > self.num_free_blocks:
            return None
        if num_to_take or len(hits[0]):
            self.req_to_block_ids.pop(req_id, None)  # the table grows
        self.coordinator.save_new_computed_blocks(req_id, hits)
        new_blocks = self.coordinator.allocate_new_blocks(req_id, num_computed + num_new_slots)

        self.req_num_filled_slots[req_id] = total_tokens
        # Only blocks full of the request's own tokens: proposed (speculative) tokens past
        # `num_tokens` may be rejected, and their KV with them. (Most steps fill no block: the
        # check is made here, without the call.)
        num_full = min(total_tokens, request.num_tokens) // self.block_size
        if self.enable_prefix_caching and num_full > self.req_num_cached_blocks.get(req_id, 0):
            self._cache_full_blocks(request, num_full)
        return KVCacheBlocks(new_blocks) if any(new_blocks) else self.empty_kv_cache_blocks

    def free(self, request: Request) -> None:
        """Let go of all of `request`'s blocks, tail first (the tail is evicted first)."""
        req_id = request.request_id
        self.coordinator.free(req_id)
        self.req_to_block_ids.pop(req_id, None)
        self.req_to_block_hashes.pop(req_id, None)
        self.req_num_cached_blocks.pop(req_id, None)
        self.req_num_filled_slots.pop(req_id, None)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while any block is in use
        (`BlockPool.reset_prefix_cache`)."""
        return self.block_pool.reset_prefix_cache()

    # --- internals ----------------------------------------------------------------------------

    def _cache_full_blocks(self, request: Request, num_full: int) -> None:
        """Register the request's newly full blocks (up to its first `num_full`) in the prefix
        cache, in every group."""
        req_id = request.request_id
        hashes = self.req_to_block_hashes.setdefault(req_id, [])
        extend_block_hashes(
            hashes, request.all_token_ids, self.block_size, num_full * self.block_size
        )
        self.coordinator.cache_blocks(request, hashes, num_full)
        self.req_num_cached_blocks[req_id] = num_full
