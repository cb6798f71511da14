"""The blocks panel's state: every physical KV block and the free block queue, from events.

`BlocksState` is one panel of `VizState` (`state.py`); `reduce_blocks` is its pure reducer,
called only for the events in `BLOCK_EVENTS`: any other event leaves the panel the very same
object. It reads nothing but its own panel and the event. A block event replaces its own
block's `BlockInfo` and shares every other entry with the state before.

How the free block queue is rebuilt (see `nanovllm.events`): it starts as 0..N-1 from head to
tail; `BlockAllocated` takes the head (after a `BlockEvicted` when that block still held a cached
prefix), `CacheHit(was_free=True)` pulls a block out of the middle, and `BlockFreed` with
`ref_count == 0` appends it at the tail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nanovllm.events import (
    BlockAllocated,
    BlockCached,
    BlockEvicted,
    BlockFreed,
    CacheHit,
    EngineSnapshot,
    Event,
)
from nanovllm.viz.frozen import evolve, without


@dataclass(frozen=True)
class BlockInfo:
    """One physical KV block. In the free queue exactly when `ref_count == 0`."""

    ref_count: int = 0
    owners: tuple[str, ...] = ()  # requests holding it, in the order they took it
    block_hash: str | None = None  # set while it is registered in the prefix cache
    last_owner: str | None = None  # who held it last
    cached_by: str | None = None  # the request that registered its prefix (None: not known)

    @property
    def cached(self) -> bool:
        return self.block_hash is not None


@dataclass(frozen=True)
class BlocksState:
    """The device pool's blocks, by id, and the free block queue."""

    blocks: tuple[BlockInfo, ...] = ()
    free_queue: tuple[int, ...] = ()  # head first
    # The null block (`EngineStarted.null_block`): taken before any event, never freed, no owner.
    null_block: int | None = None


def fresh_blocks(num_blocks: int, null_block: int | None = None) -> BlocksState:
    """A fresh pool: every block free, the queue 0..N-1 (less the null block, if any)."""
    queue = tuple(b for b in range(num_blocks) if b != null_block)
    return BlocksState((BlockInfo(),) * num_blocks, queue, null_block)


def reduce_blocks(panel: BlocksState, event: Event) -> BlocksState:
    """The blocks after `event`."""
    if isinstance(event, EngineSnapshot):
        return _on_engine_snapshot(event, panel.null_block)
    if not 0 <= event.block_id < len(panel.blocks):  # a trace cut in the middle: skipped
        return panel
    return _HANDLERS[type(event)](panel, event)


def _set(panel: BlocksState, block_id: int, info: BlockInfo, free_queue: tuple[int, ...]):
    """The panel with block `block_id` replaced; the other entries are the same objects."""
    blocks = panel.blocks[:block_id] + (info,) + panel.blocks[block_id + 1 :]
    return BlocksState(blocks, free_queue, panel.null_block)


def _give(panel: BlocksState, request_id: str, block_id: int, ref_count: int, left_free: bool):
    """`request_id` now holds `block_id`."""
    block = panel.blocks[block_id]
    new_block = evolve(
        block, ref_count=ref_count, owners=block.owners + (request_id,), last_owner=request_id
    )
    free_queue = without(panel.free_queue, block_id) if left_free else panel.free_queue
    return _set(panel, block_id, new_block, free_queue)


def _on_block_allocated(panel: BlocksState, e: BlockAllocated) -> BlocksState:
    # Off the head of the free queue when `from_free_queue`, when events are consistent.
    ref_count = panel.blocks[e.block_id].ref_count + 1
    return _give(panel, e.request_id, e.block_id, ref_count, e.from_free_queue)


def _on_cache_hit(panel: BlocksState, e: CacheHit) -> BlocksState:
    # Out of the middle of the free queue when `was_free`.
    return _give(panel, e.request_id, e.block_id, e.ref_count, e.was_free)


def _on_block_freed(panel: BlocksState, e: BlockFreed) -> BlocksState:
    block = panel.blocks[e.block_id]
    new_block = evolve(block, ref_count=e.ref_count, owners=without(block.owners, e.request_id))
    free_queue = panel.free_queue
    if e.ref_count == 0 and e.block_id not in free_queue:
        free_queue = free_queue + (e.block_id,)  # joins the tail
    return _set(panel, e.block_id, new_block, free_queue)


def _on_block_cached(panel: BlocksState, e: BlockCached) -> BlocksState:
    new_block = evolve(panel.blocks[e.block_id], block_hash=e.block_hash, cached_by=e.request_id)
    return _set(panel, e.block_id, new_block, panel.free_queue)


def _on_block_evicted(panel: BlocksState, e: BlockEvicted) -> BlocksState:
    new_block = evolve(panel.blocks[e.block_id], block_hash=None, cached_by=None)
    return _set(panel, e.block_id, new_block, panel.free_queue)


def snapshot_order(e: EngineSnapshot) -> list:
    """The snapshot's requests, running ones first in admission order, then the waiting ones
    (the order they took their blocks in; the queues panel numbers them in it too)."""
    order = {rid: i for i, rid in enumerate((*e.running, *e.waiting))}
    return sorted(e.requests, key=lambda r: order.get(r.request_id, len(order)))


def _on_engine_snapshot(e: EngineSnapshot, null_block: int | None) -> BlocksState:
    """A late subscriber's start: the engine's blocks and free queue replace ours (the null
    block stays the one `EngineStarted` named)."""
    owners: dict[int, tuple[str, ...]] = {}
    for r in snapshot_order(e):
        for table in (r.block_table, *r.group_block_tables):
            for block_id in table:
                if block_id != null_block:
                    owners[block_id] = owners.get(block_id, ()) + (r.request_id,)
    blocks = tuple(
        BlockInfo(
            ref_count=b.ref_count,
            owners=owners.get(b.block_id, ()),
            block_hash=b.block_hash,
            last_owner=owners.get(b.block_id, (None,))[-1],
        )
        for b in sorted(e.blocks, key=lambda b: b.block_id)
    )
    return BlocksState(blocks, e.free_queue, null_block)


_HANDLERS: dict[type, Callable[[BlocksState, Event], BlocksState]] = {
    BlockAllocated: _on_block_allocated,
    CacheHit: _on_cache_hit,
    BlockFreed: _on_block_freed,
    BlockCached: _on_block_cached,
    BlockEvicted: _on_block_evicted,
}
BLOCK_EVENTS = frozenset((*_HANDLERS, EngineSnapshot))
