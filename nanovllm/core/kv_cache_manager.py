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
- Freed blocks go back to the tail of the `FreeBlockQueue` *with their hash*: they stay reusable
  until they reach the head and are handed out again (lazy LRU eviction). A request's blocks are
  freed tail first, so the end of a sequence is evicted before its (more shareable) beginning.
  The blocks themselves, the free queue, the hash map and eviction are the `BlockPool`'s
  (`block_pool.py`); this manager keeps what belongs to each request, as vLLM v1 splits them.

Taking, returning and cache-hitting a block cost O(1) each (no list scans), so `allocate_slots`
and `free` cost O(blocks they take or return). Each request's block ids are kept as a tuple
(`block_ids`), rebuilt only after its blocks change: an unchanged table costs one dict lookup
and is the very same object as last step's (the persistent batch checks that identity first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nanovllm.core.block_hash import extend_block_hashes, short
from nanovllm.core.block_pool import BlockPool
from nanovllm.core.free_block_queue import FreeBlockQueue, KVCacheBlock
from nanovllm.events import BlockAllocated, BlockCached, BlockFreed, CacheHit, EventBus
from nanovllm.request import Request

logger = logging.getLogger("nanovllm")


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        events: EventBus | None = None,
        free_block_queue: Callable[[list[KVCacheBlock]], FreeBlockQueue] = FreeBlockQueue,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.events = events or EventBus()
        # The blocks, the free queue (a lesson gives its own), the hash map, this step's changes.
        self.block_pool = pool = BlockPool(num_blocks, self.events, free_block_queue)
        self.blocks, self.cached_block_hash_to_block = pool.blocks, pool.cached_block_hash_to_block
        # Per request: its blocks (the block table), the hashes of its full blocks so far,
        # how many of its blocks are registered in the cache, and how many slots hold tokens.
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_hashes: dict[str, list[bytes]] = {}
        self.req_num_cached_blocks: dict[str, int] = {}
        self.req_num_filled_slots: dict[str, int] = {}
        # Per request: its block ids as a tuple, built from `req_to_blocks` on first read after a
        # change (`block_ids`); every method here that changes a request's blocks drops it.
        self.req_to_block_ids: dict[str, tuple[int, ...]] = {}
        # Sum over blocks of max(ref_cnt - 1, 0) (sharing), so `num_filled_slots` costs O(1)
        # per request holding blocks.
        self.num_extra_refs = 0

    # --- queries ----------------------------------------------------------------------------

    @property
    def free_block_queue(self) -> FreeBlockQueue:
        return self.block_pool.free_block_queue

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return self.block_pool.num_cached_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def get_block_table(self, request_id: str) -> list[int]:
        """The request's physical block ids, in logical order (a new list)."""
        return list(self.block_ids(request_id))

    def block_ids(self, request_id: str) -> tuple[int, ...]:
        """The request's physical block ids, in logical order: the same tuple object until its
        blocks change."""
        ids = self.req_to_block_ids.get(request_id)
        if ids is None:
            blocks = self.req_to_blocks.get(request_id)
            if blocks is None:
                return ()  # (not kept: it holds no blocks)
            ids = self.req_to_block_ids[request_id] = tuple(b.block_id for b in blocks)
        return ids

    def num_filled_slots(self) -> int:
        """Slots in used blocks that hold a token's KV (a shared block counts once)."""
        return sum(self.req_num_filled_slots.values()) - self.num_extra_refs * self.block_size

    def num_allocated_slots(self) -> int:
        return self.num_used_blocks * self.block_size

    # --- prefix cache lookup ----------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached full blocks that starts `request`'s tokens.

        Returns the blocks and how many tokens they cover. At least one token is always left
        to compute: the step must end on a real forward pass that produces the next logits.
        Nothing is allocated or referenced here; `allocate_slots` does that. A request that
        asks for prompt logprobs reads nothing: each prompt token's logits must be computed.
        """
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        extend_block_hashes(hashes, request.all_token_ids, self.block_size, request.num_tokens)
        max_blocks = (request.num_tokens - 1) // self.block_size
        computed: list[KVCacheBlock] = []
        for i, block_hash in enumerate(hashes[:max_blocks]):
            tokens = tuple(request.all_token_ids[i * self.block_size : (i + 1) * self.block_size])
            block = self.block_pool.get_cached_block(block_hash, tokens)  # (tokens checked too)
            if block is None:
                break
            computed.append(block)
        return computed, len(computed) * self.block_size

    # --- allocation -------------------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> int:
        """How many blocks `allocate_slots` takes from the free queue for `num_new_tokens` slots
        (vLLM's name): its new blocks, and its prefix-cache hits on free blocks."""
        new_computed_blocks = new_computed_blocks or []
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_slots = num_computed + num_new_tokens
        num_held = len(self.req_to_blocks.get(request.request_id, ())) + len(new_computed_blocks)
        num_new_blocks = max(-(-num_slots // self.block_size) - num_held, 0)  # (ceil)
        # A hit on a free block takes it out of the free queue too (hits: only at admission).
        return num_new_blocks + sum(b.ref_cnt == 0 for b in new_computed_blocks)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens of `request` (after its computed ones).

        `new_computed_blocks` are prefix-cache hits from `get_computed_blocks` for a request
        being admitted. `num_lookahead_tokens` more slots are reserved past the new tokens, for a
        draft model to write its own KV of the tokens it proposes after this step (vLLM's
        argument of the same name); they are never cached. Returns the newly taken blocks, or
        None (and changes nothing) when there are not enough free blocks: the scheduler then
        preempts someone or waits.
        """
        new_computed_blocks = new_computed_blocks or []
        num_to_take = self.get_num_blocks_to_allocate(
            request, num_new_tokens + num_lookahead_tokens, new_computed_blocks
        )
        if num_to_take > self.num_free_blocks:
            return None
        req_id = request.request_id
        blocks = self.req_to_blocks.setdefault(req_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total_tokens = num_computed + num_new_tokens

        if num_to_take or new_computed_blocks:
            self.req_to_block_ids.pop(req_id, None)  # the table grows
        emit = self.events.active
        for block in new_computed_blocks:
            was_free = self.block_pool.touch(block)
            num_to_take -= was_free  # a hit on a free block took it out of the free queue
            self.num_extra_refs += not was_free
            blocks.append(block)
            if emit:
                self.events.emit(
                    CacheHit(req_id, block.block_id, len(blocks) - 1, was_free, block.ref_cnt)
                )

        new_blocks = []
        for _ in range(num_to_take):
            block = self.block_pool.get_new_block()  # (evicted from the prefix cache if cached)
            blocks.append(block)
            new_blocks.append(block)
            if emit:
                self.events.emit(BlockAllocated(req_id, block.block_id, len(blocks) - 1))

        self.req_num_filled_slots[req_id] = total_tokens
        # Only blocks full of the request's own tokens: proposed (speculative) tokens past
        # `num_tokens` may be rejected, and their KV with them. (Most steps fill no block: the
        # check is made here, without the call.)
        num_full = min(total_tokens, request.num_tokens) // self.block_size
        if self.enable_prefix_caching and num_full > self.req_num_cached_blocks.get(req_id, 0):
            self._cache_full_blocks(request, blocks, num_full)
        return new_blocks

    def free(self, request: Request) -> None:
        """Let go of all of `request`'s blocks, tail first (the tail is evicted first)."""
        req_id = request.request_id
        blocks = self.req_to_blocks.pop(req_id, [])
        self.req_to_block_ids.pop(req_id, None)
        emit = self.events.active
        for block in reversed(blocks):
            self.block_pool.free_block(block)
            self.num_extra_refs -= block.ref_cnt > 0
            if emit:
                self.events.emit(
                    BlockFreed(req_id, block.block_id, block.ref_cnt, block.block_hash is not None)
                )
        self.req_to_block_hashes.pop(req_id, None)
        self.req_num_cached_blocks.pop(req_id, None)
        self.req_num_filled_slots.pop(req_id, None)

    def free_slots_from(
        self, request: Request, num_tokens: int, num_lookahead_tokens: int = 0
    ) -> None:
        """Keep only the slots of the request's first `num_tokens` tokens (and the
        `num_lookahead_tokens` reserved after them, see `allocate_slots`): the blocks past them
        (which held rejected proposals) go back to the free queue, tail first."""
        req_id = request.request_id
        blocks = self.req_to_blocks.get(req_id, [])
        keep = -(-(num_tokens + num_lookahead_tokens) // self.block_size)
        if len(blocks) > keep:
            self.req_to_block_ids.pop(req_id, None)  # the table shrinks
        emit = self.events.active
        while len(blocks) > keep:
            block = blocks.pop()
            assert block.ref_cnt == 1 and block.block_hash is None, "a block past them is private"
            self.block_pool.free_block(block)
            if emit:
                self.events.emit(BlockFreed(req_id, block.block_id, 0, False))
        self.req_num_filled_slots[req_id] = num_tokens

    def begin_step(self) -> None:
        """A new step starts: the pool forgets the previous step's cache changes."""
        self.block_pool.begin_step()

    def uncache_step_blocks(self) -> None:
        """This step's forward pass failed: the blocks it registered leave the prefix cache."""
        self.block_pool.uncache_step_blocks()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after the weights change). Returns whether it did.

        Refused while any block is in use, as vLLM refuses: a running request's blocks hold KV
        from before the reset, and other requests could still share them.
        """
        if self.num_used_blocks:
            logger.warning(
                "nanovllm: cannot reset the prefix cache while %d of %d blocks are in use; "
                "wait for the running requests to finish (or abort them) and try again",
                self.num_used_blocks,
                self.num_blocks,
            )
            return False
        self.block_pool.evict_free_blocks()
        return True

    # --- internals ----------------------------------------------------------------------------

    def _cache_full_blocks(
        self, request: Request, blocks: list[KVCacheBlock], num_full: int
    ) -> None:
        """Register the request's newly full blocks (up to its first `num_full`) in the prefix
        cache.

        Blocks are registered as soon as the tokens filling them are scheduled: the forward pass
        writes every new K/V before any attention reads the cache, so even a request admitted
        later in the same step may share them.
        """
        req_id = request.request_id
        start = self.req_num_cached_blocks.get(req_id, 0)
        hashes = self.req_to_block_hashes.setdefault(req_id, [])
        extend_block_hashes(
            hashes, request.all_token_ids, self.block_size, num_full * self.block_size
        )
        emit = self.events.active
        for i in range(start, num_full):
            block = blocks[i]
            if block.block_hash is not None:
                continue  # a prefix-cache hit: already registered
            tokens = tuple(request.all_token_ids[i * self.block_size : (i + 1) * self.block_size])
            # (not when the same tokens are cached in another block: that one is kept)
            if self.block_pool.cache_block(block, hashes[i], tokens) and emit:
                self.events.emit(BlockCached(req_id, block.block_id, short(hashes[i])))
        self.req_num_cached_blocks[req_id] = num_full
