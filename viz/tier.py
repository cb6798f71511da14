"""The KV connector's second tier, rebuilt from events: which prefix each host slot holds.

With a KV connector (`nanovllm/kv_transfer/`) the KV of a prefix can live outside the device
pool. The OffloadingConnector keeps a host tier of `num_tier_blocks` slots: a cached block that
the device pool hands out again is first saved into a slot (`KVBlockSaved`), a full tier drops
its least recently used entry to make room (`KVTierEvicted`), and a later request whose prefix
reaches into the tier gets that KV copied back into a device block (`KVBlockLoaded`). The
SharedStorageConnector saves to files instead (`tier_slot` -1): there are no slots to draw, only
the blocks that went out and came back in.

`TierState` is the tier panel of `VizState`, changed only by the functions here: `reduce_tier`
is its reducer, which `state.reduce` calls only for the events in `TIER_EVENTS`; besides its
own panel it reads the step's event before this one and the device pool's size. Slot contents
follow the events exactly. The LRU order takes more care, because the events of a step do not
arrive in the order the tier changed:

    during scheduling   each admitted request's tier hits are touched (most recently used);
                        each block the device pool evicts is announced (`BlockEvicted`)
    end of scheduling   each evicted block, in that order: touched if the tier holds its
                        hash already (no event), else inserted (`KVTierEvicted`? then
                        `KVBlockSaved`); then one `KVBlockLoaded` per hit touched earlier

So the pool's evictions are remembered (`pending`) and replayed in order when a save shows
where the inserts fall among them; a hit's touch is placed *before* every entry the step's
saves touched or inserted (`touched`), where it happened.

The step's traffic (device block -> slot saves, slot -> device block loads, dropped slots,
failed loads) is kept with the step itself (`state.StepRecord`), like the free queue's moves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nanovllm.events import (
    BlockAllocated,
    BlockEvicted,
    EngineSnapshot,
    EngineStarted,
    Event,
    KVBlockLoaded,
    KVBlockSaved,
    KVLoadFailed,
    KVTierEvicted,
    StepSummary,
)

MAX_FAILURES = 5  # load failures kept (request id, error), most recent last


@dataclass(frozen=True)
class TierState:
    """The connector and its tier. `connector` None: the engine has none."""

    connector: str | None = None
    role: str | None = None
    slots: tuple[str | None, ...] = ()  # slot -> short hash of the block it holds (None: empty)
    lru: tuple[str, ...] = ()  # the hashes held, least recently used first
    num_saved: int = 0  # blocks saved (to slots, or to storage)
    num_loaded: int = 0  # blocks loaded back into the device pool
    num_dropped: int = 0  # entries the full tier dropped (`KVTierEvicted`)
    num_failed: int = 0  # requests whose external KV failed to load
    failures: tuple[tuple[str, str], ...] = ()  # (request id, error), most recent last
    # The step in progress: hashes the device pool evicted, not replayed yet, and the hashes
    # the step's saves touched or inserted (the most recently used end of `lru`).
    pending: tuple[str, ...] = ()
    touched: frozenset[str] = frozenset()

    @property
    def has_slots(self) -> bool:
        """Whether the connector has a host tier (else it saves to storage)."""
        return bool(self.slots)

    @property
    def num_blocks(self) -> int:
        return len(self.slots)

    @property
    def num_filled(self) -> int:
        return sum(1 for h in self.slots if h is not None)

    def slot_of(self, block_hash: str) -> int | None:
        """The slot holding `block_hash`, or None."""
        return self.slots.index(block_hash) if block_hash in self.slots else None

    def next_dropped(self) -> int | None:
        """The slot a full tier empties next (its least recently used entry), or None."""
        if not self.lru or self.num_filled < self.num_blocks:
            return None
        return self.slot_of(self.lru[0])


def tier_from(started: EngineStarted) -> TierState:
    """An empty tier for the engine that `started` describes."""
    if started.kv_connector is None:
        return TierState()
    return TierState(
        connector=started.kv_connector,
        role=started.kv_role,
        slots=(None,) * max(started.num_tier_blocks, 0),
    )


def from_snapshot(tier: TierState, entries: tuple) -> TierState:
    """A late viewer's start (`EngineSnapshot.tier`): the engine's entries, (short hash, slot)
    least recently used first, fill the slots; the counts start from here."""
    if not tier.has_slots:
        return tier
    slots: list[str | None] = [None] * len(tier.slots)
    for block_hash, slot in entries:
        slots[slot] = block_hash
    return replace(
        tier,
        slots=tuple(slots),
        lru=tuple(block_hash for block_hash, _ in entries),
        pending=(),
        touched=frozenset(),
    )


def pool_evicted(tier: TierState, block_hash: str) -> TierState:
    """The device pool handed out a block that cached `block_hash`: at the end of scheduling
    the tier saves or touches it."""
    if not tier.has_slots:
        return tier
    return replace(tier, pending=tier.pending + (block_hash,))


def _replay(tier: TierState, upto: int) -> TierState:
    """Apply the touches of the first `upto` pending evictions: a hash the tier holds becomes
    the most recently used; one it does not hold was not saved (every slot pinned)."""
    lru, touched = tier.lru, set(tier.touched)
    for h in tier.pending[:upto]:
        if h in lru:
            lru = tuple(x for x in lru if x != h) + (h,)
            touched.add(h)
    return replace(tier, lru=lru, touched=frozenset(touched), pending=tier.pending[upto:])


def _valid(tier: TierState, slot: int) -> bool:
    return 0 <= slot < len(tier.slots)


def saved(tier: TierState, block_hash: str, slot: int) -> TierState:
    """A block's KV was saved: into `slot` (a tier), or to storage (`slot` -1)."""
    tier = replace(tier, num_saved=tier.num_saved + 1)
    if not _valid(tier, slot):
        return tier
    at = tier.pending.index(block_hash) if block_hash in tier.pending else 0
    tier = _replay(tier, at)
    pending = tier.pending[1:] if tier.pending[:1] == (block_hash,) else tier.pending
    old = tier.slots[slot]
    lru = tuple(h for h in tier.lru if h not in (old, block_hash)) + (block_hash,)
    slots = tier.slots[:slot] + (block_hash,) + tier.slots[slot + 1 :]
    return replace(tier, slots=slots, lru=lru, pending=pending, touched=tier.touched | {block_hash})


def dropped(tier: TierState, block_hash: str, slot: int) -> TierState:
    """The full tier dropped `block_hash` from `slot` (a save takes the slot next)."""
    tier = replace(tier, num_dropped=tier.num_dropped + 1)
    if not _valid(tier, slot):
        return tier
    held = tier.slots[slot]
    lru = tuple(h for h in tier.lru if h not in (held, block_hash))
    slots = tier.slots[:slot] + (None,) + tier.slots[slot + 1 :]
    return replace(tier, slots=slots, lru=lru)


def loaded(tier: TierState, block_hash: str, slot: int) -> TierState:
    """A tier hit's KV was copied into a device block. Its touch happened during scheduling,
    before the step's saves: it goes just before the entries they touched."""
    tier = replace(tier, num_loaded=tier.num_loaded + 1)
    if not _valid(tier, slot):
        return tier
    tier = _replay(tier, len(tier.pending))  # every save of the step is done
    if block_hash in tier.touched or block_hash not in tier.lru:
        return tier
    rest = tuple(h for h in tier.lru if h != block_hash)
    at = next((i for i, h in enumerate(rest) if h in tier.touched), len(rest))
    return replace(tier, lru=rest[:at] + (block_hash,) + rest[at:])


def load_failed(tier: TierState, request_id: str, error: str) -> TierState:
    """A request's external KV could not be loaded (the engine undid the step)."""
    failures = (tier.failures + ((request_id, error),))[-MAX_FAILURES:]
    return end_step(replace(tier, num_failed=tier.num_failed + 1, failures=failures))


def end_step(tier: TierState) -> TierState:
    """The step is over: every pending eviction is replayed, the next step starts afresh."""
    if not tier.pending and not tier.touched:
        return tier
    return replace(_replay(tier, len(tier.pending)), touched=frozenset())


def reduce_tier(
    tier: TierState, event: Event, previous: Event | None, num_blocks: int
) -> TierState:
    """The tier after `event`. `previous`: the step's event before it (None: `event` opens the
    step); `num_blocks`: the device pool's size."""
    if isinstance(event, KVBlockSaved):
        return saved(tier, event.block_hash, event.tier_slot)
    if isinstance(event, KVTierEvicted):
        return dropped(tier, event.block_hash, event.tier_slot)
    if isinstance(event, KVBlockLoaded):
        return loaded(tier, event.block_hash, event.tier_slot)
    if isinstance(event, KVLoadFailed):
        return load_failed(tier, event.request_id, event.error)
    if isinstance(event, StepSummary):
        return end_step(tier)
    if isinstance(event, EngineSnapshot):
        return from_snapshot(tier, event.tier)
    # A `BlockAllocated` off the head of the free queue right after that block's
    # `BlockEvicted`: the pool hands out a block still caching a prefix, which the tier saves
    # at the end of scheduling (only these evictions; a failed step's uncaching is not one).
    if (
        event.from_free_queue
        and 0 <= event.block_id < num_blocks
        and isinstance(previous, BlockEvicted)
        and previous.block_id == event.block_id
    ):
        return pool_evicted(tier, previous.block_hash)
    return tier


TIER_EVENTS = frozenset(
    (BlockAllocated, KVBlockSaved, KVTierEvicted, KVBlockLoaded, KVLoadFailed, StepSummary)
) | {EngineSnapshot}
