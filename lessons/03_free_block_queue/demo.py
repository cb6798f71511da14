"""Lesson 03 demo: the engine's free block queue at work, and why it is not a deque.

1. A queue of 8 blocks: take some, free them (tail first, as the KV cache manager does), pull one
   out of the middle (a prefix-cache hit): the order after each operation.
2. Removing a given block from a `collections.deque`, an `OrderedDict` and the intrusive list,
   as the queue grows: O(n), O(1) and O(1).

Run it: `nanovllm lesson 3 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

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
    console.print(
        "  Block 0, the start of A's prompt and the most likely to be shared again, is evicted "
        "last; the next blocks handed out are 5, 6, 7, those never used.\n"
    )
    # A new request that starts like A: with chained hashes (lesson 08) it can reuse A's block 1
    # only together with block 0 before it, so both leave the queue: 1 from the middle, 0 from
    # the tail.
    queue.remove(blocks[0])
    queue.remove(blocks[1])
    show(console, queue, "a new request starts like A: it reuses A's first two blocks, 0 and 1")
    console.print(
        "  Two O(1) unlinks: block 1 came out of the middle of the queue, block 0 off its tail.\n"
    )

    table = Table(title="Removing a given block from the middle (microseconds per remove)")
    table.add_column("free blocks", justify="right")
    table.add_column("collections.deque", justify="right")
    table.add_column("OrderedDict", justify="right")
    table.add_column("FreeBlockQueue", justify="right")
    for n in (1_000, 10_000, 100_000):
        items = [KVCacheBlock(i) for i in range(n)]
        victims = items[n // 2 : n // 2 + 100]
        d = deque(items)
        t_deque = _per_remove(victims, d.remove)
        od = OrderedDict((block.block_id, block) for block in items)
        t_od = _per_remove([block.block_id for block in victims], od.pop)
        q = FreeBlockQueue(items)
        t_queue = _per_remove(victims, q.remove)
        table.add_row(
            f"{n:,}", f"{t_deque * 1e6:,.1f}", f"{t_od * 1e6:,.2f}", f"{t_queue * 1e6:,.2f}"
        )
    console.print(table)
    console.print(
        "The deque scans for the block, so its cost grows with the queue; the OrderedDict and "
        "the linked list do not, whatever the size."
    )


def _per_remove(victims: list, remove) -> float:
    """Seconds per call of `remove` over `victims`."""
    start = time.perf_counter()
    for victim in victims:
        remove(victim)
    return (time.perf_counter() - start) / len(victims)


if __name__ == "__main__":
    run(Console())
