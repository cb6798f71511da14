"""Lesson 03 demo: the engine's free block queue at work, and why it is not a deque.

1. A queue of 8 blocks: take some, free them (tail first, as the KV cache manager does), pull one
   out of the middle (a prefix-cache hit): the order after each operation.
2. Removing a given block from a `collections.deque` versus from the intrusive list, as the queue
   grows: O(n) versus O(1).

Run it: `nanovllm lesson 3 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import time
from collections import deque

from rich.console import Console
from rich.table import Table

from nanovllm.core.free_block_queue import FreeBlockQueue, KVCacheBlock


def show(console: Console, queue: FreeBlockQueue, what: str) -> None:
    ids = " <-> ".join(str(b.block_id) for b in queue.get_all_free_blocks()) or "(empty)"
    console.print(f"  {what}\n      head <-> [bold]{ids}[/] <-> tail")


def run(console: Console) -> None:
    blocks = [KVCacheBlock(i) for i in range(8)]
    queue = FreeBlockQueue(blocks)
    show(console, queue, "a fresh queue of 8 blocks")
    taken = [queue.popleft() for _ in range(3)]
    show(console, queue, f"request A takes 3 blocks: {[b.block_id for b in taken]}")
    more = [queue.popleft() for _ in range(2)]
    show(console, queue, f"request B takes 2: {[b.block_id for b in more]}")
    for block in reversed(taken):  # the KV cache manager frees a request's blocks tail first
        queue.append(block)
    show(console, queue, "A finishes: its blocks join the tail, last first")
    queue.remove(blocks[1])
    show(console, queue, "a new request reuses block 1's cached prefix")
    console.print(
        "  The next blocks handed out are 5, 6, 7: those freed longest ago. Block 0, the start "
        "of A's prompt and the most likely to be shared again, is evicted last.\n"
    )

    table = Table(title="Removing a given block from the middle (microseconds per remove)")
    table.add_column("free blocks", justify="right")
    table.add_column("collections.deque", justify="right")
    table.add_column("FreeBlockQueue", justify="right")
    for n in (1_000, 10_000, 100_000):
        items = [KVCacheBlock(i) for i in range(n)]
        d = deque(items)
        victims = items[n // 2 : n // 2 + 100]
        start = time.perf_counter()
        for block in victims:
            d.remove(block)
        t_deque = (time.perf_counter() - start) / len(victims)
        q = FreeBlockQueue(items)
        start = time.perf_counter()
        for block in victims:
            q.remove(block)
        t_queue = (time.perf_counter() - start) / len(victims)
        table.add_row(f"{n:,}", f"{t_deque * 1e6:,.1f}", f"{t_queue * 1e6:,.2f}")
    console.print(table)
    console.print(
        "The deque scans for the block, so its cost grows with the queue; the linked list "
        "relinks two neighbours, whatever the size."
    )


if __name__ == "__main__":
    run(Console())
