"""Lesson 03 exercise: the free block queue, a doubly linked list through the blocks.

`KVCacheBlock` is the engine's block record: it has `block_id`, `ref_cnt`, and the two links this
queue uses, `prev_free` and `next_free` (both None while the block is not in the queue).
Check with `nanovllm lesson 3 --check`.
"""

from __future__ import annotations

from nanovllm.core.free_block_queue import KVCacheBlock


class FreeBlockQueue:
    """Free blocks in least-recently-freed order: taken at the head, returned at the tail.

        head sentinel <-> b7 <-> b2 <-> b9 <-> tail sentinel

    Every operation is O(1): none may walk the list.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        """The queue starts with `blocks`, in that order (blocks[0] at the head)."""
        self.num_free_blocks = len(blocks)
        self._head = KVCacheBlock(-1)  # sentinels: never handed out, never removed
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = self._tail
        self._tail.prev_free = prev

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it is in the queue, in O(1).

        Afterwards its neighbours point at each other, its own `prev_free` and `next_free` are
        None, and `num_free_blocks` is one less. Raise ValueError (and change nothing) if the
        block is not in the queue, i.e. its links are None.
        """
        raise NotImplementedError("write FreeBlockQueue.remove (lesson 03)")

    def popleft(self) -> KVCacheBlock:
        """Remove and return the block at the head (the least recently freed one).

        Raise ValueError if the queue is empty (the head sentinel's next is the tail sentinel).
        """
        raise NotImplementedError("write FreeBlockQueue.popleft (lesson 03)")

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail (it is now the most recently freed), in O(1).

        Raise ValueError (and change nothing) if it is already in the queue, i.e. its links are
        not None: appending it again would corrupt the list (a double free).
        """
        raise NotImplementedError("write FreeBlockQueue.append (lesson 03)")

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every free block from head to tail. O(n): for tests and displays only."""
        out = []
        block = self._head.next_free
        while block is not None and block is not self._tail:
            out.append(block)
            block = block.next_free
        return out
