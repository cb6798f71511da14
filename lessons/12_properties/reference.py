"""Lesson 12 reference: one good set of properties (a solution, to compare with yours).

Unlike other lessons, the thing checked here is a set of properties, not engine code; the engine
is what they run against. These are the properties the course's own lessons 02 and 03 use,
rewritten in the exercise's shape.
"""

from __future__ import annotations

from nanovllm.core.free_block_queue import KVCacheBlock
from nanovllm.lessons.scripts import AllocatorCase, run_allocator_script
from nanovllm.lessons.sim import blocks_for

__all__ = ["prop_free_queue", "prop_allocator", "prop_slot_mapping"]


def prop_free_queue(FreeBlockQueue, script) -> None:  # noqa: N803
    blocks = [KVCacheBlock(i) for i in range(8)]
    queue = FreeBlockQueue(blocks)
    model = list(range(8))
    for op, block_id in script:
        if op == "popleft":
            taken = queue.popleft()
            assert taken.block_id == model.pop(0), "popleft must take the least recently freed"
        elif op == "append":
            queue.append(blocks[block_id])
            model.append(block_id)
        else:
            queue.remove(blocks[block_id])
            model.remove(block_id)
        assert [b.block_id for b in queue.get_all_free_blocks()] == model, f"after {op}"
        assert queue.num_free_blocks == len(model), f"num_free_blocks after {op}"


def prop_allocator(make_manager, case: AllocatorCase) -> None:
    manager = make_manager(case.num_blocks, case.block_size)
    tables: dict[str, list[int]] = {}  # as they were before the operation
    tokens: dict[str, int] = {}
    num_free = case.num_blocks
    for snap in run_allocator_script(manager, case.script):
        owned = [b for table in snap.tables.values() for b in table]
        free = {b.block_id for b in manager.free_block_queue.get_all_free_blocks()}
        assert len(owned) == len(set(owned)), f"a block has two owners after {snap.op}"
        assert not free & set(owned), f"a block is both free and owned after {snap.op}"
        assert manager.num_free_blocks + len(owned) == case.num_blocks, (
            f"blocks leaked or duplicated after {snap.op}"
        )
        for rid, table in snap.tables.items():
            assert len(table) == blocks_for(snap.tokens[rid], case.block_size), (
                f"{rid} has {len(table)} blocks for {snap.tokens[rid]} tokens"
            )
        if not snap.ok:
            _, rid, n = snap.op
            needed = blocks_for(tokens.get(rid, 0) + n, case.block_size) - len(tables.get(rid, []))
            assert needed > num_free, f"{snap.op} failed with {num_free} free blocks for {needed}"
            assert (snap.tables, manager.num_free_blocks) == (tables, num_free), (
                f"the failed {snap.op} changed the state"
            )
        tables, tokens, num_free = snap.tables, snap.tokens, manager.num_free_blocks


def prop_slot_mapping(slot_for, block_table, block_size) -> None:
    slots = []
    for pos in range(len(block_table) * block_size):
        slot = slot_for(block_table, pos, block_size)
        assert divmod(slot, block_size) == (block_table[pos // block_size], pos % block_size), (
            f"position {pos}: slot {slot}"
        )
        slots.append(slot)
    assert len(set(slots)) == len(slots), "two positions share a slot"
