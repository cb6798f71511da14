"""HostBlockTier: a second tier for the prefix cache, in host memory, in LRU order.

The device pool (`core/kv_cache_manager.py`) keeps a freed block's KV until the block is handed
out again. The OffloadingConnector (`offloading.py`) copies such a block out *before* it is
reused, into one of this tier's `num_blocks` host slots, under the same block hash; a later
request whose prefix hashes to it gets the KV copied back instead of computing it.

This class is only the bookkeeping (which hash lives in which slot, and which slot goes next);
the K/V tensors live with the worker side of the connector. It is an LRU cache:

- every entry is a block hash -> slot, in an `OrderedDict` from least to most recently used;
- `lookup` finds a hash's slot without changing the order; `touch` marks an entry used;
- `insert` takes a free slot, or else evicts the least recently used entry that is not
  `pinned` (a slot that this step is still to read from must not be overwritten); when every
  entry is pinned the tier is full and `insert` returns None.

Invariant: each slot is either free or holds exactly one hash, so `len(entries) + len(free
slots) == num_blocks`.

Cost of each operation (n = num_blocks, p = entries pinned this step):
    lookup, touch, remove   O(1)
    insert                  O(1) with a free slot, else O(p): pinned entries are the most
                            recently touched, so the scan from the LRU end passes at most them
    num_matched(hashes)     O(number of hashes matched)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence


class HostBlockTier:
    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_cpu_blocks must be an int >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.slot_of: OrderedDict[bytes, int] = OrderedDict()  # LRU first, MRU last
        self.free_slots: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives slot 0

    def __len__(self) -> int:
        return len(self.slot_of)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.slot_of

    def lookup(self, block_hash: bytes) -> int | None:
        """The slot holding `block_hash`, or None; the LRU order does not change."""
        return self.slot_of.get(block_hash)

    def touch(self, block_hash: bytes) -> None:
        """Mark `block_hash` as just used: it is now the last to be evicted."""
        self.slot_of.move_to_end(block_hash)

    def num_matched(self, block_hashes: Sequence[bytes]) -> int:
        """How many of `block_hashes`, from the first, are all in the tier (a prefix hit)."""
        n = 0
        for block_hash in block_hashes:
            if block_hash not in self.slot_of:
                break
            n += 1
        return n

    def insert(
        self, block_hash: bytes, pinned: Collection[bytes] = ()
    ) -> tuple[int, bytes | None] | None:
        """Give `block_hash` (not in the tier yet) a slot, as the most recently used entry.

        Returns the slot and the hash evicted to free it (None when a slot was free), or None
        when every entry is pinned (nothing is changed then).
        """
        assert block_hash not in self.slot_of, "insert a hash once; touch it after that"
        evicted = None
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            evicted = next((h for h in self.slot_of if h not in pinned), None)
            if evicted is None:
                return None
            slot = self.slot_of.pop(evicted)
        self.slot_of[block_hash] = slot
        return slot, evicted

    def remove(self, block_hash: bytes) -> None:
        """Forget `block_hash` (its KV turned out unusable); its slot is free again."""
        self.free_slots.append(self.slot_of.pop(block_hash))

    def clear(self) -> None:
        """Forget every entry (the prefix cache was reset)."""
        self.slot_of.clear()
        self.free_slots = list(range(self.num_blocks - 1, -1, -1))
