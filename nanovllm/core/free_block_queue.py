"""The KV cache's blocks, and the free block queue that hands them out in O(1).

The paged KV cache is cut into `num_blocks` fixed-size blocks. Each `KVCacheBlock` is the CPU-side
record of one of them: its id (which is also its index in the GPU/CPU tensor), how many requests
hold it (`ref_cnt`), and, once it is full, the prefix-cache hash of the tokens it holds.

Free blocks wait in a `FreeBlockQueue`, a doubly linked list threaded *through the blocks
themselves* (`prev_free` / `next_free`), between two sentinel blocks:

    head sentinel <-> b7 <-> b2 <-> b9 <-> ... <-> tail sentinel
                      ^ taken next (least recently freed)      ^ freed blocks join here

Invariant: a block is in the queue exactly when its `ref_cnt` is 0. The queue is in LRU order:
blocks are taken from the head and returned at the tail, so a freed block keeps its cached
prefix for as long as possible (it is only *evicted* when it reaches the head and is handed out
again). A prefix-cache hit on a free block pulls it out of the middle.

Cost of each operation (n = number of blocks):
    popleft         O(1)   take the least recently freed block
    append          O(1)   return a block at the tail
    remove          O(1)   unlink a block from anywhere (a prefix-cache hit); no search needed,
                           because the block knows its neighbours
    get_all_free_blocks  O(n), for tests and the visualizer only

Why not a Python `deque`? `deque.remove(x)` is a linear scan. With 10^6 blocks a prefix-cache hit
would cost milliseconds; the intrusive list keeps every hot-path operation constant-time.
"""

from __future__ import annotations


class KVCacheBlock:
    """CPU-side metadata of one physical KV cache block."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # Set when the block is full and registered in the prefix cache; kept while the block
        # sits in the free queue, dropped when it is evicted (handed out again).
        self.block_hash: bytes | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of free blocks, with sentinel head and tail (see module docstring)."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        # Sentinels have id -1 and never leave the list; they remove every "is this the
        # first/last element?" special case from append and remove.
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = self._tail
        self._tail.prev_free = prev

    def popleft(self) -> KVCacheBlock:
        """Take the block at the head (least recently freed). O(1)."""
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free blocks left")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it is in the queue. O(1)."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail (most recently freed). O(1)."""
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every free block from head to tail. O(n): for tests and visualisation, not the engine."""
        out = []
        block = self._head.next_free
        while block is not None and block is not self._tail:
            out.append(block)
            block = block.next_free
        return out

    def peek(self, n: int) -> list[int]:
        """Ids of the first `n` blocks at the head: the next ones to be handed out. O(n)."""
        out = []
        block = self._head.next_free
        while block is not None and block is not self._tail and len(out) < n:
            out.append(block.block_id)
            block = block.next_free
        return out
