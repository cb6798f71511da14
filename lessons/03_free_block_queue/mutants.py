"""Lesson 03 planted bugs: a free queue in the wrong order, that miscounts, or that walks."""

from __future__ import annotations

from nanovllm.core.free_block_queue import FreeBlockQueue
from nanovllm.lessons.testing import Mutant, variant


class _Lifo(FreeBlockQueue):
    """Hands out the most recently freed block: the wrong eviction order (MRU, not LRU)."""

    def popleft(self):
        block = self._tail.prev_free
        if block is self._head:
            raise ValueError("no free blocks left")
        self.remove(block)
        return block


class _AppendAtHead(FreeBlockQueue):
    """Returns freed blocks to the head, so they are handed out (evicted) first."""

    def append(self, block):
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError("already in the free queue")
        first = self._head.next_free
        self._head.next_free = block
        block.prev_free = self._head
        block.next_free = first
        first.prev_free = block
        self.num_free_blocks += 1


class _AppendLinksToItself(FreeBlockQueue):
    """Makes the appended block its own next (`block.next_free = block`): the list becomes a
    cycle, and a walk from the head never ends."""

    def append(self, block):
        super().append(block)
        block.next_free = block


class _RemoveKeepsCount(FreeBlockQueue):
    def remove(self, block):
        super().remove(block)
        self.num_free_blocks += 1  # forgets that the queue shrank


class _RemoveKeepsLinks(FreeBlockQueue):
    """Unlinks the block but leaves its own pointers set: it still looks free."""

    def remove(self, block):
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError("not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        self.num_free_blocks -= 1


class _UncheckedAppend(FreeBlockQueue):
    """Does not notice a block that is already free (a double free corrupts the list)."""

    def append(self, block):
        block.prev_free = block.next_free = None
        super().append(block)


class _UncheckedRemove(FreeBlockQueue):
    """Does not check that the block is in the queue before unlinking it."""

    def remove(self, block):
        prev, nxt = block.prev_free, block.next_free
        prev.next_free = nxt  # AttributeError (not ValueError) when the block is not free
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1


class _ScanningRemove(FreeBlockQueue):
    """Correct results, but finds the block by walking from the head: O(n), like deque.remove."""

    def remove(self, block):
        node = self._head.next_free
        while node is not self._tail and node is not block:
            node = node.next_free
        if node is self._tail:
            raise ValueError("not in the free queue")
        super().remove(block)


class _PopleftUnchecked(FreeBlockQueue):
    """popleft on an empty queue hands out the tail sentinel instead of raising."""

    def popleft(self):
        block = self._head.next_free
        if block is self._tail:
            return block
        self.remove(block)
        return block


MUTANTS = [
    Mutant(
        "lifo",
        "popleft takes the most recently freed block (wrong eviction order)",
        lambda ref: variant(ref, FreeBlockQueue=_Lifo),
    ),
    Mutant(
        "append-at-head",
        "freed blocks go to the head and are reused first (wrong eviction order)",
        lambda ref: variant(ref, FreeBlockQueue=_AppendAtHead),
    ),
    Mutant(
        "append-links-to-itself",
        "append makes the block its own next: the list is a cycle, a walk never ends",
        lambda ref: variant(ref, FreeBlockQueue=_AppendLinksToItself),
    ),
    Mutant(
        "remove-keeps-count",
        "remove does not decrement num_free_blocks",
        lambda ref: variant(ref, FreeBlockQueue=_RemoveKeepsCount),
    ),
    Mutant(
        "remove-keeps-links",
        "remove leaves the block's own links set, so it still looks free",
        lambda ref: variant(ref, FreeBlockQueue=_RemoveKeepsLinks),
    ),
    Mutant(
        "double-free-unchecked",
        "append accepts a block that is already in the queue",
        lambda ref: variant(ref, FreeBlockQueue=_UncheckedAppend),
    ),
    Mutant(
        "remove-unchecked",
        "remove does not check membership (crashes with AttributeError)",
        lambda ref: variant(ref, FreeBlockQueue=_UncheckedRemove),
    ),
    Mutant(
        "scanning-remove",
        "remove walks the list to find the block: O(n)",
        lambda ref: variant(ref, FreeBlockQueue=_ScanningRemove),
    ),
    Mutant(
        "popleft-empty-returns-sentinel",
        "popleft on an empty queue returns the tail sentinel",
        lambda ref: variant(ref, FreeBlockQueue=_PopleftUnchecked),
    ),
]
