"""BlockPool: the KV cache's physical blocks, shared by every request, as vLLM v1 keeps them.

The pool knows blocks, never requests (those are `kv_cache_manager.py`'s):

- every block (`blocks`) and its reference count: how many requests hold it;
- the `FreeBlockQueue` of blocks no request holds, in LRU order (`free_block_queue.py`);
- the prefix cache's map from a block hash to the block holding those tokens. A freed block
  keeps its hash until it is handed out again: that is when it is *evicted* (lazily, from the
  head of the free queue, so the least recently used cached block goes first);
- with a sliding-window group, the *null block* (block 0, never handed out): it stands in a
  block table for blocks a window has left behind (`single_type_kv_cache_manager.py`); a model
  without windows has none, and all its blocks are usable;
- what happened to the cache this step, kept as data for whoever needs it after scheduling:
  the blocks registered (`step_cached_blocks`: if the step's forward pass fails, exactly these
  leave the cache) and the cached blocks evicted (`step_evicted_blocks`: their KV is intact
  until the forward pass, so a KV connector may copy it out first). `begin_step` clears both,
  once per step.

Every operation here costs O(1) per block (no scans), except `reset_prefix_cache`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nanovllm.core.block_hash import short
from nanovllm.core.free_block_queue import FreeBlockQueue, KVCacheBlock
from nanovllm.events import BlockEvicted, EventBus

logger = logging.getLogger("nanovllm")


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        events: EventBus | None = None,
        free_block_queue: Callable[[list[KVCacheBlock]], FreeBlockQueue] = FreeBlockQueue,
        with_null_block: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.events = events or EventBus()
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = free_block_queue(self.blocks)  # (lesson 03 gives its own)
        # Block 0, out of the free queue for good (vLLM reserves it always; here only when a
        # group slides, so a model without windows keeps every block and every block id).
        self.null_block = self.free_block_queue.popleft() if with_null_block else None
        # Prefix cache: block hash -> the block holding those tokens (full blocks only).
        self.cached_block_hash_to_block: dict[bytes, KVCacheBlock] = {}
        self.num_cached_free_blocks = 0  # in the free queue but still holding a cached prefix
        # This step's cache changes, as data (see the module docstring).
        self.step_cached_blocks: list[tuple[KVCacheBlock, bytes]] = []
        self.step_evicted_blocks: list[tuple[int, bytes]] = []

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds (the null block, a placeholder, is no one's)."""
        return self.num_blocks - self.num_free_blocks - (self.null_block is not None)

    def get_cached_block(
        self, block_hash: bytes, token_ids: tuple[int, ...]
    ) -> KVCacheBlock | None:
        """The cached block holding `token_ids` under `block_hash`, or None. The tokens are
        compared too, not only the hash: a hash collision must not serve the wrong KV."""
        block = self.cached_block_hash_to_block.get(block_hash)
        return block if block is not None and block.token_ids == token_ids else None

    def touch(self, block: KVCacheBlock) -> bool:
        """One more request holds `block` (a prefix-cache hit). Returns whether it was free."""
        if block is self.null_block:
            return False  # (held by no one: a placeholder)
        was_free = block.ref_cnt == 0
        if was_free:
            self.free_block_queue.remove(block)  # O(1): out of the middle of the queue
            self.num_cached_free_blocks -= 1  # only cached blocks are ever hit
        block.ref_cnt += 1
        return was_free

    def get_new_block(self) -> KVCacheBlock:
        """The free queue's head, for one request, evicted from the prefix cache if cached."""
        block = self.free_block_queue.popleft()
        if block.block_hash is not None:
            self.step_evicted_blocks.append((block.block_id, block.block_hash))
            self.evict(block)
        block.ref_cnt = 1
        return block

    def free_block(self, block: KVCacheBlock) -> None:
        """One request less holds `block`; at none, it goes to the free queue's tail (its
        hash kept: it stays a prefix-cache hit until evicted)."""
        if block is self.null_block:
            return
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            self.free_block_queue.append(block)
            if block.block_hash is not None:
                self.num_cached_free_blocks += 1

    def cache_block(
        self, block: KVCacheBlock, block_hash: bytes, token_ids: tuple[int, ...]
    ) -> bool:
        """Register a full block in the prefix cache; False when those tokens are cached in
        another block already (that one is kept)."""
        if block_hash in self.cached_block_hash_to_block:
            return False
        block.block_hash, block.token_ids = block_hash, token_ids
        self.cached_block_hash_to_block[block_hash] = block
        self.step_cached_blocks.append((block, block_hash))
        return True

    def evict(self, block: KVCacheBlock) -> None:
        """Drop `block` from the prefix cache (its KV is no longer anyone's prefix)."""
        assert block.block_hash is not None
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        if self.events.active:
            self.events.emit(BlockEvicted(block.block_id, short(block.block_hash)))
        if block.ref_cnt == 0:
            self.num_cached_free_blocks -= 1
        block.block_hash = None
        block.token_ids = None

    def begin_step(self) -> None:
        """A new step starts: forget which blocks the previous one registered and evicted."""
        self.step_cached_blocks.clear()
        self.step_evicted_blocks.clear()

    def uncache_step_blocks(self) -> None:
        """Drop from the prefix cache every block this step registered (its forward pass failed).

        Those blocks were registered when their tokens were scheduled, but their KV may never
        have been written. Blocks registered in earlier steps hold KV that was written, and stay.
        """
        for block, block_hash in self.step_cached_blocks:
            if block.block_hash == block_hash:  # (still the same registration)
                self.evict(block)
        self.step_cached_blocks.clear()

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
        for block in self.free_block_queue.get_all_free_blocks():
            if block.block_hash is not None:
                self.evict(block)
        return True
