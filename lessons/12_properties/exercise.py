"""Lesson 12 exercise: write the properties.

Each function receives a system under test and one generated input; it must raise (an
`assert` is the usual way) if and only if the system misbehaves on that input. They run against
the engine, where they must pass, and against systems with planted bugs and generated mutants
(small changes to the engine's code), each of which at least one of them must catch. Check with `nanovllm lesson 12 --check`.
"""

from __future__ import annotations

from collections.abc import Callable

from nanovllm.core.free_block_queue import KVCacheBlock  # noqa: F401  (for your queues)
from nanovllm.lessons.scripts import AllocatorCase, run_allocator_script  # noqa: F401
from nanovllm.lessons.sim import blocks_for  # noqa: F401  (ceil(tokens / block_size))


def prop_free_queue(FreeBlockQueue: type, script: list[tuple[str, int]]) -> None:  # noqa: N803
    """Replay `script` on `FreeBlockQueue([KVCacheBlock(i) for i in range(8)])`, against a list
    of block ids as the model (initially [0, ..., 7], head first).

    Operations (always legal for a correct queue): ("popleft", -1), ("append", block_id) for a
    block out of the queue, ("remove", block_id) for a block in it. Keep your own list of the
    8 KVCacheBlock objects, so "append" and "remove" can pass the right one.

    After every operation, check what a correct LRU queue guarantees: popleft returns the
    model's head; the queue's blocks, head to tail (`get_all_free_blocks()`), are the model's;
    `num_free_blocks` is the model's length.
    """
    raise NotImplementedError("write prop_free_queue (lesson 12)")


def prop_allocator(make_manager: Callable[[int, int], object], case: AllocatorCase) -> None:
    """Replay `case.script` on `make_manager(case.num_blocks, case.block_size)` (a
    KVCacheManager without prefix caching: `num_free_blocks`, `free_block_queue`,
    `get_block_table(id)`, ...) with `run_allocator_script`, and after every operation check:

    - conservation: free blocks + blocks in live tables == num_blocks;
    - exclusivity: no block is in two tables, and no block in a table is in the free queue;
    - sizes: each live request's table holds exactly blocks_for(its tokens, block_size) blocks;
    - atomicity: when an allocation fails (`snapshot.ok` is False), the tables and the number of
      free blocks are exactly what they were before it;
    - no false refusal: an allocation fails only when the blocks it needs (blocks_for the
      request's tokens after it, less the blocks its table held before) are more than the free
      blocks before it.

    (At the end, freeing every live request must leave all blocks free: you may add that.)
    """
    raise NotImplementedError("write prop_allocator (lesson 12)")


def prop_slot_mapping(
    slot_for: Callable[[list[int], int, int], int], block_table: list[int], block_size: int
) -> None:
    """Check `slot_for(block_table, position, block_size)` for every position the table's
    blocks hold (0 .. len(block_table) * block_size - 1): each slot decodes, by divmod with
    block_size, to the physical block the table names for that position and to the position's
    offset within its block; and no two positions share a slot.
    """
    raise NotImplementedError("write prop_slot_mapping (lesson 12)")
