"""Lesson 16 planted bugs: a window that frees too much, too little or in the wrong order, and
hits that count without the window's first block or miss the latest window."""

from __future__ import annotations

from nanovllm.core.sliding_window_manager import SlidingWindowManager
from nanovllm.lessons.testing import Mutant, variant


class _FreesTheWindowsFirstBlock(SlidingWindowManager):
    """Rounds the skipped blocks up: the block holding the window's first token goes too."""

    def remove_skipped_blocks(self, request_id, num_computed_tokens):
        skipped = self.get_num_skipped_tokens(num_computed_tokens)
        return super().remove_skipped_blocks(
            request_id, num_computed_tokens + (-skipped) % self.block_size
        )


class _SkipsTheWindowsFirstToken(SlidingWindowManager):
    """n - sliding_window + 2: the window's first token counted as skipped."""

    def get_num_skipped_tokens(self, num_computed_tokens):
        return max(num_computed_tokens - self.sliding_window + 2, 0)


class _KeepsOneTokenTooMany(SlidingWindowManager):
    """n - sliding_window: one token too few skipped, a block freed one step late."""

    def get_num_skipped_tokens(self, num_computed_tokens):
        return max(num_computed_tokens - self.sliding_window, 0)


class _FreesEarliestFirst(SlidingWindowManager):
    """Frees the skipped blocks earliest first: the earliest reaches the free queue's head
    side first, so a prefix's first block is evicted before its later ones."""

    def remove_skipped_blocks(self, request_id, num_computed_tokens):
        blocks = self.req_to_blocks.get(request_id, [])
        first = min(
            self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks)
        )
        freed = False
        for i in range(first):
            if blocks[i] is not self.block_pool.null_block:
                self.free_block(request_id, blocks[i])
                blocks[i] = self.block_pool.null_block
                self.num_null_blocks += 1
                freed = True
        return freed


class _DropsFromTheTable(SlidingWindowManager):
    """Deletes the freed blocks from the table instead of putting the null block in their
    place: logical block i is no longer block_table[i]."""

    def remove_skipped_blocks(self, request_id, num_computed_tokens):
        blocks = self.req_to_blocks.get(request_id, [])
        before = list(blocks)
        freed = super().remove_skipped_blocks(request_id, num_computed_tokens)
        if freed:
            kept = [b for b, old in zip(blocks, before) if b is old]
            self.num_null_blocks -= len(blocks) - len(kept)
            blocks[:] = kept
        return freed


class _UncountedNull(SlidingWindowManager):
    """Puts the null block in but does not count it in num_null_blocks."""

    def remove_skipped_blocks(self, request_id, num_computed_tokens):
        nulls = self.num_null_blocks
        freed = super().remove_skipped_blocks(request_id, num_computed_tokens)
        self.num_null_blocks = nulls
        return freed


class _FreesThePassedNulls(SlidingWindowManager):
    """Walks every skipped block without stopping at the null ones: it frees the null block
    and says it freed something every step."""

    def remove_skipped_blocks(self, request_id, num_computed_tokens):
        blocks = self.req_to_blocks.get(request_id, [])
        first = min(
            self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks)
        )
        for i in range(first - 1, -1, -1):
            if blocks[i] is self.block_pool.null_block:
                self.block_pool.null_block.ref_cnt -= 1
                self.block_pool.free_block_queue.append(blocks[i])
            else:
                self.free_block(request_id, blocks[i])
                blocks[i] = self.block_pool.null_block
                self.num_null_blocks += 1
        return first > 0


class _HitRoundsDown(SlidingWindowManager):
    """(sliding_window - 1) // block_size blocks needed, rounded down: a hit lacking the block
    that holds the window's first token."""

    def find_longest_cache_hit(self, request, block_hashes, max_length):
        hit = [self.block_pool.null_block] * (max_length // self.block_size)
        needed = (self.sliding_window - 1) // self.block_size
        if needed == 0:
            return hit
        run = 0
        for i in range(len(hit) - 1, -1, -1):
            block = self.get_cached_block(request, block_hashes, i)
            if block is None:
                run = 0
                continue
            hit[i], run = block, run + 1
            if run >= needed:
                return hit[: i + run]
        return hit[:run]


class _HitFromTheFirstBlock(SlidingWindowManager):
    """A hit as full attention's: the cached run from block 0, stopping at the first miss."""

    def find_longest_cache_hit(self, request, block_hashes, max_length):
        hit = []
        for i in range(max_length // self.block_size):
            block = self.get_cached_block(request, block_hashes, i)
            if block is None:
                break
            hit.append(block)
        return hit


class _HitScansFromTheFront(SlidingWindowManager):
    """Takes the first run of a window's blocks, scanning from block 0, not the latest."""

    def find_longest_cache_hit(self, request, block_hashes, max_length):
        null = self.block_pool.null_block
        needed = -(-(self.sliding_window - 1) // self.block_size)
        run = 0
        for i in range(max_length // self.block_size):
            if self.get_cached_block(request, block_hashes, i) is None:
                if run < needed and run == i:  # (a short run from block 0 is a hit)
                    return [self.get_cached_block(request, block_hashes, j) for j in range(run)]
                run = 0
                continue
            run += 1
            if run >= needed:
                start = i + 1 - needed
                return [null] * start + [
                    self.get_cached_block(request, block_hashes, j) for j in range(start, i + 1)
                ]
        return super().find_longest_cache_hit(request, block_hashes, max_length)


class _HitPastMaxLength(SlidingWindowManager):
    """Scans every full block of the request, ignoring max_length: no token left to compute."""

    def find_longest_cache_hit(self, request, block_hashes, max_length):
        return super().find_longest_cache_hit(
            request, block_hashes, len(block_hashes) * self.block_size
        )


class _HitKeepsEveryCachedBlock(SlidingWindowManager):
    """Returns every cached block of the hit, not null before the window: the request holds
    blocks its window never reads."""

    def find_longest_cache_hit(self, request, block_hashes, max_length):
        hit = super().find_longest_cache_hit(request, block_hashes, max_length)
        return [
            self.get_cached_block(request, block_hashes, i) or b if b is self.block_pool.null_block
            else b
            for i, b in enumerate(hit)
        ]  # fmt: skip


def _m(name: str, description: str, cls: type) -> Mutant:
    return Mutant(name, description, lambda ref: variant(ref, SlidingWindowManager=cls))


MUTANTS = [
    _m("frees-the-windows-first-block", "frees the block that holds the window's first token",
       _FreesTheWindowsFirstBlock),
    _m("skips-the-windows-first-token", "n - sliding_window + 2 tokens skipped",
       _SkipsTheWindowsFirstToken),
    _m("keeps-one-token-too-many", "n - sliding_window tokens skipped", _KeepsOneTokenTooMany),
    _m("frees-earliest-first", "the free queue gets the skipped blocks earliest first",
       _FreesEarliestFirst),
    _m("drops-from-the-table", "freed blocks leave the table, no null block in their place",
       _DropsFromTheTable),
    _m("uncounted-null", "num_null_blocks not counted up", _UncountedNull),
    _m("frees-the-passed-nulls", "no stop at the null blocks already put in",
       _FreesThePassedNulls),
    _m("hit-rounds-down", "a hit lacks the block holding the window's first token",
       _HitRoundsDown),
    _m("hit-from-the-first-block", "a hit is the cached run from block 0 (full attention's)",
       _HitFromTheFirstBlock),
    _m("hit-scans-from-the-front", "the first window of cached blocks, not the latest",
       _HitScansFromTheFront),
    _m("hit-past-max-length", "max_length ignored", _HitPastMaxLength),
    _m("hit-keeps-every-cached-block", "cached blocks before the window kept, not null",
       _HitKeepsEveryCachedBlock),
]  # fmt: skip
