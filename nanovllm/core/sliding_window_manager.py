"""SlidingWindowManager: a sliding-window group's block tables, which free what the window passed.

A query at position p of a sliding-window layer sees only p - sliding_window + 1 .. p. So once a
request has computed `n` tokens, a block wholly before token n - sliding_window + 1 is never
read again by that request: `remove_skipped_blocks` frees it (the latest first, so the earliest
stays in the prefix cache longest) and the pool's *null block* takes its place in the table, so
logical block i is still `block_table[i]`. A long request holds about
sliding_window / block_size + 1 blocks in such a group, not one per block of its length.

A prefix-cache hit needs only what the token after it sees: the `sliding_window - 1` tokens
before it, so the last ceil((sliding_window - 1) / block_size) blocks of the hit must be cached
and the blocks before them may be null (`find_longest_cache_hit`). The other rules are every
group's (`single_type_kv_cache_manager.py`).
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

    def find_longest_cache_hit(
        self, request: Request, block_hashes: list[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        """Scan from the end for the latest run of cached blocks that covers a window: the
        token after the hit sees its `sliding_window - 1` tokens before it, so that many
        (ceil(that / block_size) blocks) must be cached; the blocks before them are null. A run
        from the very first block is a hit however short."""
        null = self.block_pool.null_block
        num_needed = -(-(self.sliding_window - 1) // self.block_size)
        computed = [null] * (max_length // self.block_size)
        if num_needed == 0:
            return computed  # (a window of one token: each query sees only itself)
        run = 0  # cached blocks in a row, ending at the last scanned
        for i in range(len(computed) - 1, -1, -1):
            block = self.get_cached_block(request, block_hashes, i)
            if block is None:
                run = 0
                continue
            computed[i] = block
            run += 1
            if run >= num_needed:
                return computed[: i + run]
        return computed[:run]  # (a run from block 0, shorter than a window, or nothing)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The tokens no query after the first `num_computed_tokens` sees: those before token
        `num_computed_tokens - sliding_window + 1`, the first the next query sees."""
        return max(num_computed_tokens - self.sliding_window + 1, 0)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> bool:
        """Blocks wholly among the skipped tokens go back, latest first, and the null block
        takes their place."""
        blocks = self.req_to_blocks.get(request_id, [])
        first_useful_block = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        removed = False
        for i in range(min(first_useful_block, len(blocks)) - 1, -1, -1):
            if blocks[i] is self.block_pool.null_block:
                break  # the ones before were removed earlier
            self.free_block(request_id, blocks[i])
            blocks[i] = self.block_pool.null_block
            self.num_null_blocks += 1
            removed = True
        return removed
