"""Lesson 15 exercise: the host tier's bookkeeping, an LRU cache of block hashes in slots.

The OffloadingConnector keeps the KV of blocks the device pool evicts in `num_blocks` host
slots; this class decides which block hash lives in which slot, and which entry goes when a new
one needs room. Block hashes are `bytes` (`nanovllm/core/block_hash.py`); a slot is an int in
[0, num_blocks). Check with `nanovllm lesson 15 --check`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence


class HostBlockTier:
    """An LRU cache of block hashes, each in one of `num_blocks` slots.

        slot_of:    hash_a -> 3, hash_b -> 0, hash_c -> 1    (least recently used first)
        free_slots: [2]

    Invariant: every slot is either free or holds exactly one hash, so
    `len(slot_of) + len(free_slots) == num_blocks`.
    """

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_cpu_blocks must be an int >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        # hash -> slot, least recently used first: `move_to_end(h)` makes h the most recent,
        # `next(iter(...))` walks from the least recent.
        self.slot_of: OrderedDict[bytes, int] = OrderedDict()
        self.free_slots: list[int] = list(range(num_blocks))  # any order

    def __len__(self) -> int:
        return len(self.slot_of)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.slot_of

    def lookup(self, block_hash: bytes) -> int | None:
        """The slot holding `block_hash`, or None if the tier does not hold it.

        Only a look: the LRU order does not change (the engine calls `touch` when it uses the
        entry).
        """
        raise NotImplementedError("write HostBlockTier.lookup (lesson 15)")

    def touch(self, block_hash: bytes) -> None:
        """Mark `block_hash` (in the tier) as just used: it becomes the most recently used
        entry, the last one to be evicted."""
        raise NotImplementedError("write HostBlockTier.touch (lesson 15)")

    def num_matched(self, block_hashes: Sequence[bytes]) -> int:
        """How many of `block_hashes`, counted from the first, are all in the tier: the length
        of the prefix hit. Stop at the first hash the tier does not hold (a block's KV is of no
        use without the blocks before it). The LRU order does not change."""
        raise NotImplementedError("write HostBlockTier.num_matched (lesson 15)")

    def insert(
        self, block_hash: bytes, pinned: Collection[bytes] = ()
    ) -> tuple[int, bytes | None] | None:
        """Give `block_hash` (not in the tier yet) a slot; it becomes the most recently used
        entry.

        With a free slot: take it, and return `(slot, None)`. Otherwise evict the least
        recently used entry whose hash is not in `pinned` (slots the engine reads from this
        step), give its slot to `block_hash`, and return `(slot, evicted_hash)`. If every entry
        is pinned, change nothing and return None.
        """
        raise NotImplementedError("write HostBlockTier.insert (lesson 15)")

    def remove(self, block_hash: bytes) -> None:
        """Forget `block_hash` (in the tier); its slot is free again."""
        raise NotImplementedError("write HostBlockTier.remove (lesson 15)")

    def clear(self) -> None:
        """Forget every entry; every slot is free again."""
        raise NotImplementedError("write HostBlockTier.clear (lesson 15)")
