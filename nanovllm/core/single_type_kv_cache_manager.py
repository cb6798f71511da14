"""One KV cache group's block tables: which blocks each request holds, for one attention type.

Each KV cache group (`kv_cache_interface.py`) has one `SingleTypeKVCacheManager`, all of them
taking blocks from one shared `BlockPool`. It keeps each request's block table for its group
(`req_to_blocks`: logical block i holds the request's tokens i*block_size .. (i+1)*block_size-1)
and, with prefix caching, registers full blocks in the pool's cache. vLLM v1's four rules, which
differ by attention type:

- `get_num_blocks_to_allocate`: blocks a request needs taken from the free queue to hold
  `num_tokens` tokens (prefix-cache hits on free blocks included);
- `allocate_new_blocks`: take them, appended to its table;
- `find_longest_cache_hit`: the longest run of cached blocks a request can start from;
- `remove_skipped_blocks`: free the blocks no query to come can read.

`FullAttentionManager` (here): every query sees every earlier token, so no block is ever
skipped, and a cache hit is the longest cached run from the first block.
`SlidingWindowManager` (`sliding_window_manager.py`) frees the blocks a window leaves behind.
"""

from __future__ import annotations

from nanovllm.core.block_hash import hash_with_group_id, short
from nanovllm.core.block_pool import BlockPool
from nanovllm.core.free_block_queue import KVCacheBlock
from nanovllm.core.kv_cache_interface import KVCacheSpec
from nanovllm.events import BlockAllocated, BlockCached, BlockFreed, CacheHit, EventBus
from nanovllm.request import Request


class SingleTypeKVCacheManager:
    def __init__(
        self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool, kv_cache_group_id: int,
        events: EventBus,
    ) -> None:  # fmt: skip
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.events = events
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}  # each request's block table
        self.num_cached_block: dict[str, int] = {}  # its first blocks registered in the cache
        self.num_null_blocks = 0  # null blocks in the tables, all requests together

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock]
    ) -> int:
        """Blocks taken from the free queue for the request to hold `num_tokens` tokens: new
        ones, and prefix-cache hits on free blocks (a hit takes it out of the free queue)."""
        num_required = -(-num_tokens // self.block_size)  # (ceil)
        num_held = len(self.req_to_blocks.get(request_id, ())) + len(new_computed_blocks)
        num_hits_on_free = 0  # (hits come only at admission)
        for block in new_computed_blocks:
            num_hits_on_free += block.ref_cnt == 0 and block is not self.block_pool.null_block
        return max(num_required - num_held, 0) + num_hits_on_free

    def save_new_computed_blocks(
        self, request_id: str, new_computed_blocks: list[KVCacheBlock]
    ) -> None:
        """Append prefix-cache hits (null blocks among them: a window's left-behind blocks) to
        the request's table; each real one is held once more."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        for block in new_computed_blocks:
            if block is self.block_pool.null_block:
                self.num_null_blocks += 1
            else:
                was_free = self.block_pool.touch(block)
                if self.events.active:
                    self.events.emit(CacheHit(request_id, block.block_id, len(blocks), was_free,
                                              block.ref_cnt, self.kv_cache_group_id))  # fmt: skip
            blocks.append(block)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Take blocks from the free queue until the request's table holds `num_tokens` tokens."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        new_blocks = []
        for _ in range(-(-num_tokens // self.block_size) - len(blocks)):
            block = self.block_pool.get_new_block()  # (evicted from the prefix cache if cached)
            blocks.append(block)
            new_blocks.append(block)
            if self.events.active:
                self.events.emit(BlockAllocated(request_id, block.block_id, len(blocks) - 1,
                                                True, self.kv_cache_group_id))  # fmt: skip
        return new_blocks

    def cache_blocks(self, request: Request, block_hashes: list[bytes], num_full: int) -> None:
        """Register the request's newly full blocks (up to its first `num_full`) in the prefix
        cache, under their hash and this group's id.

        Blocks are registered as soon as the tokens filling them are scheduled: the forward pass
        writes every new K/V before any attention reads the cache, so even a request admitted
        later in the same step may share them.
        """
        req_id, bs = request.request_id, self.block_size
        blocks = self.req_to_blocks[req_id]
        for i in range(self.num_cached_block.get(req_id, 0), num_full):
            block = blocks[i]
            if block.block_hash is not None or block is self.block_pool.null_block:
                continue  # a prefix-cache hit: already registered (or a placeholder)
            key = hash_with_group_id(block_hashes[i], self.kv_cache_group_id)
            tokens = tuple(request.all_token_ids[i * bs : (i + 1) * bs])
            # (not when the same tokens are cached in another block: that one is kept)
            if self.block_pool.cache_block(block, key, tokens) and self.events.active:
                self.events.emit(BlockCached(req_id, block.block_id, short(key),
                                             self.kv_cache_group_id))  # fmt: skip
        self.num_cached_block[req_id] = num_full

    def free(self, request_id: str) -> None:
        """Let go of all the request's blocks, tail first (the tail is evicted first)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        for block in reversed(blocks):
            self.free_block(request_id, block)

    def free_block(self, request_id: str, block: KVCacheBlock) -> None:
        """One of the request's blocks goes back to the pool (a null block: nothing to do)."""
        if block is self.block_pool.null_block:
            self.num_null_blocks -= 1
            return
        self.block_pool.free_block(block)
        if self.events.active:
            self.events.emit(BlockFreed(request_id, block.block_id, block.ref_cnt,
                                        block.block_hash is not None, self.kv_cache_group_id))  # fmt: skip

    def find_longest_cache_hit(
        self, request: Request, block_hashes: list[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        """The cached blocks the request can start from, covering at most `max_length` tokens
        (its tokens checked too, not only the hash: a collision must not serve the wrong KV)."""
        raise NotImplementedError

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> bool:
        """Free the blocks no query after the first `num_computed_tokens` tokens reads; returns
        whether any were."""
        raise NotImplementedError

    def get_cached_block(self, request: Request, block_hashes: list[bytes], i: int):
        """The request's block i from the prefix cache of this group, or None."""
        tokens = tuple(request.all_token_ids[i * self.block_size : (i + 1) * self.block_size])
        key = hash_with_group_id(block_hashes[i], self.kv_cache_group_id)
        return self.block_pool.get_cached_block(key, tokens)


class FullAttentionManager(SingleTypeKVCacheManager):
    """Every query sees every earlier token: keep every block, hit from the first block."""

    def find_longest_cache_hit(
        self, request: Request, block_hashes: list[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        computed: list[KVCacheBlock] = []
        for i in range(max_length // self.block_size):
            block = self.get_cached_block(request, block_hashes, i)
            if block is None:
                break
            computed.append(block)
        return computed

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> bool:
        return False  # (no block is ever out of sight)
