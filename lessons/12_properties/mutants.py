"""Lesson 12 planted bugs: property sets too weak to catch a bug, or so strict they cry wolf.

Here the reference is a set of properties, so a "bug" is a worse set: the lesson's checks must
notice that it lets a planted system bug through, or that it fails on the correct engine.
"""

from __future__ import annotations

from nanovllm.core.free_block_queue import KVCacheBlock
from nanovllm.lessons.scripts import run_allocator_script
from nanovllm.lessons.sim import blocks_for
from nanovllm.lessons.testing import Mutant, variant


def _queue_initial_state_only(FreeBlockQueue, script):  # noqa: N803
    """Checks the fresh queue, then never looks again."""
    queue = FreeBlockQueue([KVCacheBlock(i) for i in range(8)])
    assert [b.block_id for b in queue.get_all_free_blocks()] == list(range(8))
    assert queue.num_free_blocks == 8


def _allocator_sizes_only(make_manager, case):
    """Checks only the size of each block table."""
    manager = make_manager(case.num_blocks, case.block_size)
    for snap in run_allocator_script(manager, case.script):
        for rid, table in snap.tables.items():
            assert len(table) == blocks_for(snap.tokens[rid], case.block_size)


def _allocator_exclusivity_only(make_manager, case):
    """Checks that no block has two owners, but never counts the free blocks."""
    manager = make_manager(case.num_blocks, case.block_size)
    for snap in run_allocator_script(manager, case.script):
        owned = [b for table in snap.tables.values() for b in table]
        free = {b.block_id for b in manager.free_block_queue.get_all_free_blocks()}
        assert len(owned) == len(set(owned)) and not free & set(owned)


def _allocator_contiguous(make_manager, case):
    """A false alarm: insists that every block table is a run of consecutive block ids."""
    manager = make_manager(case.num_blocks, case.block_size)
    for snap in run_allocator_script(manager, case.script):
        for table in snap.tables.values():
            assert table == list(range(table[0], table[0] + len(table))) if table else True


def _slots_unique_only(slot_for, block_table, block_size):
    """Checks only that slots are distinct (an off-by-one keeps them distinct)."""
    slots = [slot_for(block_table, p, block_size) for p in range(len(block_table) * block_size)]
    assert len(set(slots)) == len(slots)


MUTANTS = [
    Mutant(
        "queue-never-replays",
        "prop_free_queue checks the fresh queue and never runs the script",
        lambda ref: variant(ref, prop_free_queue=_queue_initial_state_only),
    ),
    Mutant(
        "allocator-sizes-only",
        "prop_allocator checks table sizes only: no conservation, no exclusivity",
        lambda ref: variant(ref, prop_allocator=_allocator_sizes_only),
    ),
    Mutant(
        "allocator-never-counts",
        "prop_allocator checks exclusivity but never counts the free blocks",
        lambda ref: variant(ref, prop_allocator=_allocator_exclusivity_only),
    ),
    Mutant(
        "allocator-false-alarm",
        "prop_allocator expects contiguous block tables, which a correct allocator need not give",
        lambda ref: variant(ref, prop_allocator=_allocator_contiguous),
    ),
    Mutant(
        "slots-unique-only",
        "prop_slot_mapping checks only that slots are distinct",
        lambda ref: variant(ref, prop_slot_mapping=_slots_unique_only),
    ),
]
