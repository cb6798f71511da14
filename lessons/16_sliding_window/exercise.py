"""Lesson 16 exercise: the sliding-window manager's rules, which blocks go and which hits count.

A sliding-window layer's query at position p sees only the tokens p - sliding_window + 1 .. p.
Your `SlidingWindowManager` keeps one KV cache group's block tables (the engine's
`SingleTypeKVCacheManager` does the rest: taking blocks, caching full ones, freeing a request)
and decides two things: which of a request's blocks no query will read again, so they go back
to the pool while the request runs, and how long a prefix-cache hit is when only the last
window's blocks need to be cached. Check with `nanovllm lesson 16 --check`.

What you have from `SingleTypeKVCacheManager` (`nanovllm/core/single_type_kv_cache_manager.py`):

    self.req_to_blocks[request_id]   the request's block table: a list of KVCacheBlock, logical
                                     block i holds tokens i*block_size .. (i+1)*block_size - 1
    self.block_size                  tokens per block
    self.block_pool.null_block       the placeholder that takes a freed block's place in a table
    self.free_block(request_id, b)   give one of the request's blocks back to the pool (its
                                     tail of the free queue once no request holds it)
    self.num_null_blocks             how many null blocks the tables hold, all requests together
    self.get_cached_block(request, block_hashes, i)
                                     the request's block i from the prefix cache, or None
"""

from __future__ import annotations

from nanovllm.core.free_block_queue import KVCacheBlock
from nanovllm.core.kv_cache_interface import SlidingWindowSpec
from nanovllm.core.single_type_kv_cache_manager import SingleTypeKVCacheManager
from nanovllm.request import Request


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A query sees the last `sliding_window` tokens: free the blocks behind every window."""

    def __init__(self, kv_cache_spec: SlidingWindowSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window
        assert self.block_pool.null_block is not None, "a sliding window needs the null block"

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """How many of a request's first tokens no query after its first `num_computed_tokens`
        will see again: the next query is at position `num_computed_tokens`, and it sees the
        `sliding_window` tokens ending at itself. Never negative."""
        raise NotImplementedError("write SlidingWindowManager.get_num_skipped_tokens (lesson 16)")

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> bool:
        """Free the request's blocks that hold only skipped tokens (`get_num_skipped_tokens`),
        and return whether any was freed by this call.

        - A block that still holds one token a query will see stays.
        - Each freed block goes back with `self.free_block(request_id, block)`, the latest
          (highest logical index) first, so the earliest is the last to be evicted from the
          prefix cache; its place in the table is taken by `self.block_pool.null_block`, so
          logical block i stays `self.req_to_blocks[request_id][i]`, and
          `self.num_null_blocks` counts one more.
        - The blocks freed by an earlier call are null already: stop at the first null one
          (walking from the latest skipped block down), and never free the null block.
        - A request with no blocks (none allocated yet) frees nothing.
        """
        raise NotImplementedError("write SlidingWindowManager.remove_skipped_blocks (lesson 16)")

    def find_longest_cache_hit(
        self, request: Request, block_hashes: list[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        """The blocks a new request can start from: a list of L blocks, covering L * block_size
        tokens, L at most `max_length // block_size`, as long as can be.

        The token after the hit sees the `sliding_window - 1` tokens before it, so the last
        ceil((sliding_window - 1) / block_size) blocks of the hit (all of them, if there are
        fewer) must be cached: `self.get_cached_block(request, block_hashes, i)` is not None,
        and is the block to return at i. Every block before those is
        `self.block_pool.null_block` in the list, cached or not. Looking changes nothing.
        """
        raise NotImplementedError("write SlidingWindowManager.find_longest_cache_hit (lesson 16)")
