"""Lesson 15 planted bugs: a host tier that evicts the wrong entry, loses or shares slots, or
answers a lookup wrongly."""

from __future__ import annotations

from nanovllm.kv_transfer.host_tier import HostBlockTier
from nanovllm.lessons.testing import Mutant, variant


class _EvictsMru(HostBlockTier):
    """Evicts the most recently used unpinned entry."""

    def insert(self, block_hash, pinned=()):
        if self.free_slots:
            return super().insert(block_hash, pinned)
        evicted = next((h for h in reversed(self.slot_of) if h not in pinned), None)
        if evicted is None:
            return None
        slot = self.slot_of.pop(evicted)
        self.slot_of[block_hash] = slot
        return slot, evicted


class _IgnoresPins(HostBlockTier):
    """Evicts the least recently used entry, pinned or not."""

    def insert(self, block_hash, pinned=()):
        return super().insert(block_hash, ())


class _RefusesWhenFull(HostBlockTier):
    """A full tier refuses every insert, as if every entry were pinned."""

    def insert(self, block_hash, pinned=()):
        if not self.free_slots:
            return None
        return super().insert(block_hash, pinned)


class _InsertsAsLru(HostBlockTier):
    """A new entry goes in as the least recently used: the next to be evicted."""

    def insert(self, block_hash, pinned=()):
        placed = super().insert(block_hash, pinned)
        if placed is not None:
            self.slot_of.move_to_end(block_hash, last=False)
        return placed


class _KeepsTheEvicted(HostBlockTier):
    """Takes the evicted entry's slot but keeps the entry: two hashes in one slot."""

    def insert(self, block_hash, pinned=()):
        if self.free_slots:
            return super().insert(block_hash, pinned)
        evicted = next((h for h in self.slot_of if h not in pinned), None)
        if evicted is None:
            return None
        slot = self.slot_of[evicted]
        self.slot_of[block_hash] = slot
        return slot, evicted


class _SlotFromTheCount(HostBlockTier):
    """Numbers slots by how many entries there are: after a remove, a slot in use is given
    again."""

    def insert(self, block_hash, pinned=()):
        if len(self.slot_of) < self.num_blocks:
            slot = len(self.slot_of)
            self.slot_of[block_hash] = slot
            return slot, None
        return super().insert(block_hash, pinned)


class _TouchForgotten(HostBlockTier):
    """touch does nothing: a block used again is still evicted first."""

    def touch(self, block_hash):
        pass


class _LookupTouches(HostBlockTier):
    """lookup marks the entry used (only `touch` may)."""

    def lookup(self, block_hash):
        slot = super().lookup(block_hash)
        if slot is not None:
            self.touch(block_hash)
        return slot


class _CountsEveryHit(HostBlockTier):
    """num_matched counts every hash in the tier, not only the leading run."""

    def num_matched(self, block_hashes):
        return sum(1 for h in block_hashes if h in self.slot_of)


class _MatchTouches(HostBlockTier):
    """num_matched marks the matched entries used."""

    def num_matched(self, block_hashes):
        n = super().num_matched(block_hashes)
        for h in block_hashes[:n]:
            self.touch(h)
        return n


class _RemoveLeaksTheSlot(HostBlockTier):
    """remove forgets the hash but never frees its slot."""

    def remove(self, block_hash):
        del self.slot_of[block_hash]


class _ClearKeepsSlotsTaken(HostBlockTier):
    """clear forgets the entries but not that their slots were taken."""

    def clear(self):
        self.slot_of.clear()


class _ClearAddsEverySlot(HostBlockTier):
    """clear adds every slot to the free list, also those already free: a slot free twice is
    given to two hashes."""

    def clear(self):
        self.slot_of.clear()
        self.free_slots.extend(range(self.num_blocks))


class _ClearKeepsTheEntries(HostBlockTier):
    """clear frees every slot but keeps the entries: a slot is free and held at once."""

    def clear(self):
        self.free_slots = list(range(self.num_blocks - 1, -1, -1))


class _InsertsFifo(HostBlockTier):
    """Evicts in the order entries came in (FIFO), whatever was used since: `touch` records the
    use, insert never looks at it."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.arrival: list[bytes] = []

    def insert(self, block_hash, pinned=()):
        if self.free_slots:
            self.arrival.append(block_hash)
            return super().insert(block_hash, pinned)
        evicted = next((h for h in self.arrival if h in self.slot_of and h not in pinned), None)
        if evicted is None:
            return None
        self.arrival.remove(evicted)
        self.arrival.append(block_hash)
        slot = self.slot_of.pop(evicted)
        self.slot_of[block_hash] = slot
        return slot, evicted

    def remove(self, block_hash):
        super().remove(block_hash)
        self.arrival.remove(block_hash)

    def clear(self):
        super().clear()
        self.arrival.clear()


class _InsertPinsItself(HostBlockTier):
    """insert adds the new hash to the caller's `pinned` set: the engine's set of slots it reads
    this step, changed behind its back."""

    def insert(self, block_hash, pinned=()):
        placed = super().insert(block_hash, pinned)
        if placed is not None and isinstance(pinned, set):
            pinned.add(block_hash)
        return placed


def _m(name: str, description: str, cls: type) -> Mutant:
    return Mutant(name, description, lambda ref: variant(ref, HostBlockTier=cls))


MUTANTS = [
    _m("evicts-mru", "a full tier evicts its most recently used entry", _EvictsMru),
    _m("ignores-pins", "evicts the least recently used entry even if it is pinned", _IgnoresPins),
    _m("refuses-when-full", "a full tier refuses every insert, pinned or not", _RefusesWhenFull),
    _m("inserts-as-lru", "a new entry is the next to be evicted", _InsertsAsLru),
    _m("keeps-the-evicted", "the evicted entry stays, sharing its slot", _KeepsTheEvicted),
    _m("slot-from-the-count", "the slot is the number of entries", _SlotFromTheCount),
    _m("touch-forgotten", "touch does nothing", _TouchForgotten),
    _m("lookup-touches", "lookup changes the LRU order", _LookupTouches),
    _m("num-matched-counts-every-hit", "num_matched counts hits past a miss", _CountsEveryHit),
    _m("num-matched-touches", "num_matched changes the LRU order", _MatchTouches),
    _m("remove-leaks-the-slot", "remove does not free the slot", _RemoveLeaksTheSlot),
    _m("clear-keeps-slots-taken", "clear does not free the slots", _ClearKeepsSlotsTaken),
    _m("clear-adds-every-slot", "clear frees the free slots again", _ClearAddsEverySlot),
    _m(
        "clear-keeps-the-entries", "clear frees the slots, keeps the entries", _ClearKeepsTheEntries
    ),
    _m("evicts-fifo", "a full tier evicts the oldest entry, used since or not", _InsertsFifo),
    _m("insert-changes-pinned", "insert adds to the caller's pinned set", _InsertPinsItself),
]
