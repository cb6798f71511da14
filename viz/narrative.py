"""The step told in words: one `Note` per thing that happened, in the engine's order.

A step's story (`story.py`, when a view asks for `StepRecord.notes`) calls
`narrate(state, event)` with the state *before* the event, so a note can say what the event meant there: that a block came off the head of the free queue
and evicted the prefix another request had cached in it, that a prefix hit pulled a block out
of the middle of the queue, which blocks a preempted request gave back. Runs of events that
belong together (a request's blocks freed one by one, then its preemption; the step's decodes;
its sampled tokens) become one note, so a step reads as a short list:

    r11 arrives: 23 prompt tokens, at the back of the waiting queue
    r12 preempted (lost 37 tokens): blocks 24 14 to the tail; back to the front of the queue
    r11 logical block 2 <- block 24 (head of the free queue; evicts r3's cached prefix)
    r15 prefix hit: logical 0-2 <- blocks 0 1 2 (pulled from the middle of the free queue)
    r3: proposed 4, accepted 1, rejected 3 (+1 token of its own); block 17 to the tail
    host tier saves blocks the device pool hands out again: block 5 -> slot 0, block 2 -> slot 1
    r16 host tier hit: slot 0 -> block 9 (KV copied in before the forward pass, not computed)

With a KV connector (`tier.py`) the saves of a step are one note (a full tier's drop told with
the save that takes its slot), and each request's loads another. With the P2pConnector
(disaggregated prefill and decode, `disagg.py`) the same events say where the KV went:

    r3 sends blocks 4 5 to the decode engine (hash 1f2e3d 9a8b7c)
    r3: blocks arrived from the prefill engine (hash 1f2e3d 9a8b7c), staged in host memory
    r3 loads blocks 7 8 from the KV the prefill engine sent (hash 1f2e3d 9a8b7c), not computed
    r3 computes its prompt locally because its KV did not arrive within 10 s

A verification's note takes in the `BlockFreed` events of its request that follow it (the
blocks that held only rejected proposals), even when other requests' verifications come in
between: the engine verifies every request first and rolls back after. The children of one
parallel-sampling parent arrive as one note.

A `Note` (`note.py`) keeps the events' data, not only its text, so that merging a new event
into it is exact; `text` is built from that data when a view asks for it.

`narrate` reads the state before the event through `WholeState` (`whole_state.py`), the fields
of a `VizState` that readers below `state.py` may read: the state's module builds the stories,
so this one cannot import it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from nanovllm.events import (
    BlockAllocated,
    BlockCached,
    BlockEvicted,
    BlockFreed,
    CacheHit,
    EngineSnapshot,
    Event,
    ExpertLoads,
    GrammarMasked,
    KVBlockLoaded,
    KVBlockReceived,
    KVBlockSaved,
    KVLoadFailed,
    KVTierEvicted,
    RequestAdded,
    RequestFinished,
    RequestPreempted,
    RequestRejected,
    RequestScheduled,
    SpecTokensVerified,
    StepSummary,
    TokenEmitted,
)
from nanovllm.viz.executor import EXECUTOR_EVENTS, executor_words, waiting_words
from nanovllm.viz.experts import expert_words
from nanovllm.viz.families import follows
from nanovllm.viz.note import (
    ARRIVE,
    CACHE,
    DECODE,
    DROP,
    EVICT,
    EXEC,
    FETCH,
    FINISH,
    FREE,
    GRAMMAR,
    HIT,
    LOAD,
    LOAD_FAILED,
    LOCAL,
    PREEMPT,
    RECEIVE,
    REJECT,
    SAVE,
    SCHEDULE,
    SEND,
    SNAPSHOT,
    SPEC,
    SUMMARY,
    TAKE,
    TOKENS,
    WINDOW,
    Note,
)
from nanovllm.viz.waiting import blocks_words
from nanovllm.viz.words import count

if TYPE_CHECKING:
    from nanovllm.viz.whole_state import WholeState

P2P = "P2pConnector"

MAX_ITEMS = 64  # items kept in one merged note (the text says how many more)


def _owner(state: WholeState, block_id: int) -> str | None:
    block = state.blocks[block_id] if 0 <= block_id < len(state.blocks) else None
    return block.cached_by if block is not None else None


def _window_passed(state: WholeState, e: BlockFreed) -> bool:
    """Whether a sliding window passed the freed block: one before the last of its table (a
    request that finishes, is preempted or drops rejected proposals frees its tail first)."""
    info = state.requests.get(e.request_id)
    if state.null_block is None or info is None:
        return False
    tables = info.block_tables
    table = tables[e.kv_cache_group_id] if e.kv_cache_group_id < len(tables) else ()
    return e.block_id in table[:-1]


def narrate(state: WholeState, event: Event) -> Note | None:
    """The note for `event`, applied to `state` as event number `len(step events)` of the step."""
    i = len(state.draft.events)
    if isinstance(event, RequestAdded):
        where = len(state.waiting)
        item = (event.num_prompt_tokens, where, event.request_id)
        return Note(ARRIVE, event.request_id, i, i, (item,), count=1)
    if isinstance(event, RequestRejected):
        return Note(REJECT, event.request_id, i, i, detail=event.reason, count=1)
    if isinstance(event, RequestScheduled):
        info = state.requests.get(event.request_id)
        admitted = info is not None and info.status == "waiting"
        if not event.is_prefill and not admitted:
            return Note(DECODE, None, i, i, ((event.request_id, event.num_tokens),), count=1)
        item = (event.num_tokens, event.num_computed_tokens, event.is_chunk, admitted)
        return Note(SCHEDULE, event.request_id, i, i, (item,), count=1)
    if isinstance(event, BlockEvicted):
        return Note(EVICT, None, i, i, ((event.block_id, _owner(state, event.block_id)),), count=1)
    if isinstance(event, BlockAllocated):
        item = (event.logical_index, event.block_id, None, event.from_free_queue)
        return Note(TAKE, event.request_id, i, i, (item,), count=1)
    if isinstance(event, CacheHit):
        item = (event.logical_index, event.block_id, event.was_free, event.ref_count)
        return Note(HIT, event.request_id, i, i, (item,), count=1)
    if isinstance(event, BlockCached):
        return Note(CACHE, event.request_id, i, i, ((event.block_id, event.block_hash),), count=1)
    if isinstance(event, BlockFreed):
        item = (event.block_id, event.ref_count, event.cached)
        kind = WINDOW if _window_passed(state, event) else FREE
        return Note(kind, event.request_id, i, i, (item,), count=1)
    if isinstance(event, RequestPreempted):
        detail = f"lost {count(event.num_computed_tokens_lost, 'computed token')}"
        return Note(PREEMPT, event.request_id, i, i, detail=detail, count=0)
    if isinstance(event, RequestFinished):
        detail = f"{event.finish_reason}, {count(event.num_output_tokens, 'token')}"
        return Note(FINISH, event.request_id, i, i, detail=detail, count=0)
    if state.tier.connector == P2P:
        note = _narrate_p2p(event, i)
        if note is not None:
            return note
    if isinstance(event, KVBlockSaved):
        item = (event.block_id, event.tier_slot, event.block_hash, None)
        return Note(SAVE, event.request_id, i, i, (item,), count=1)
    if isinstance(event, KVTierEvicted):
        return Note(DROP, None, i, i, ((event.tier_slot, event.block_hash),), count=1)
    if isinstance(event, KVBlockLoaded):
        item = (event.tier_slot, event.block_id)
        return Note(LOAD, event.request_id, i, i, (item,), count=1)
    if isinstance(event, KVLoadFailed):
        return Note(LOAD_FAILED, event.request_id, i, i, detail=event.error, count=0)
    if isinstance(event, SpecTokensVerified):
        item = (len(event.proposed), event.num_accepted)
        return Note(SPEC, event.request_id, i, i, (item,), count=1)
    if isinstance(event, GrammarMasked):
        items = tuple(event.allowed.items())[:MAX_ITEMS]
        return Note(GRAMMAR, None, i, i, items, detail=str(event.vocab_size), count=len(items))
    if isinstance(event, TokenEmitted):
        return Note(TOKENS, None, i, i, ((event.request_id, event.text_delta),), count=1)
    if isinstance(event, EXECUTOR_EVENTS):
        return Note(EXEC, None, i, i, detail=executor_words(event) or "")
    if isinstance(event, ExpertLoads):  # (told on the executor's line)
        return Note(EXEC, None, i, i, detail=expert_words(event))
    if isinstance(event, StepSummary):
        # Split as the step view splits it (a decode's proposals are decode tokens).
        scheduled = state.draft.scheduled
        tokens = sum(s.num_tokens for s in scheduled)
        decode = sum(s.num_tokens for s in scheduled if s.is_decode)
        proposed = sum(s.num_proposed for s in scheduled)
        split = f"prefill {tokens - decode} + decode {decode}"
        if proposed:
            split += f", {proposed} of them proposed"
        detail = (
            f"step {event.step} done: {count(tokens, 'token')} ({split}); "
            f"{event.num_running} running, {event.num_waiting} waiting"
        )
        blocks = blocks_words(event)
        if not blocks:  # (else the waiting head's words say when each count was true)
            detail += f", {count(event.num_free_blocks, 'block')} free"
        detail += waiting_words(event.waiting_reason, event.waiting_head, event.num_waiting)
        detail += blocks
        return Note(SUMMARY, None, i, i, detail=detail)
    if isinstance(event, EngineSnapshot):
        detail = (
            f"joined a running engine at step {event.step}: {len(event.running)} running, "
            f"{len(event.waiting)} waiting, {count(len(event.free_queue), 'block')} free"
        )
        return Note(SNAPSHOT, None, i, i, detail=detail)
    return None


def _narrate_p2p(event: Event, i: int) -> Note | None:
    """The P2pConnector's events: blocks sent, arrived, loaded, or a prompt computed locally."""
    if isinstance(event, KVBlockSaved):
        return Note(SEND, event.request_id, i, i, ((event.block_id, event.block_hash),), count=1)
    if isinstance(event, KVBlockReceived):
        # The scenario's transfer ids are its request ids (`disagg.py`).
        return Note(RECEIVE, event.transfer_id, i, i, ((event.block_hash,),), count=1)
    if isinstance(event, KVBlockLoaded):
        return Note(FETCH, event.request_id, i, i, ((event.block_id, event.block_hash),), count=1)
    if isinstance(event, KVLoadFailed):
        return Note(LOCAL, event.request_id, i, i, detail=event.error, count=0)
    return None


def _join(a: Note, b: Note, kind: str | None = None, detail: str | None = None) -> Note:
    items = (a.items + b.items)[:MAX_ITEMS]
    return replace(
        a,
        kind=kind or a.kind,
        request_id=a.request_id or b.request_id,
        last=b.last,
        items=items,
        detail=a.detail if detail is None else detail,
        count=a.count + b.count,
    )


def merge(a: Note, b: Note) -> Note | None:
    """`a` and `b` told as one note, or None when they stay two."""
    same = a.request_id == b.request_id
    if a.kind == b.kind and a.kind in (DECODE, TOKENS):
        return _join(a, b)
    if a.kind == b.kind == EXEC:  # the executor's stages of one step: one line
        return _join(a, b, detail=f"{a.detail} → {b.detail}")
    if a.kind == b.kind and same and a.kind in (TAKE, HIT, CACHE, FREE, WINDOW, SAVE, LOAD, SEND):
        return _join(a, b)
    if a.kind == b.kind and same and a.kind in (RECEIVE, FETCH):
        return _join(a, b)
    if a.kind == DROP and b.kind == SAVE and b.items[0][1] == a.items[0][0]:
        # The full tier dropped its least recently used entry to make room: one note says both.
        block, slot, block_hash, _ = b.items[0]
        return replace(b, first=a.first, items=((block, slot, block_hash, a.items[0][1]),))
    if a.kind == EVICT and b.kind == TAKE and len(a.items) == 1 and b.items[0][1] == a.items[0][0]:
        # The block came off the head still holding a cached prefix: one note says both.
        logical, block, _, fresh = b.items[0]
        taken = (logical, block, a.items[0][1] or "?", fresh)
        return replace(b, first=a.first, items=(taken,))
    if a.kind == FREE and same and b.kind in (PREEMPT, FINISH):
        return _join(a, b, kind=b.kind, detail=b.detail)
    if a.kind == b.kind == ARRIVE and follows(a.items[-1][2], b.request_id) is not None:
        return _join(a, b)  # the next child of one parallel-sampling parent
    return None


def _into_verification(notes: tuple[Note, ...], note: Note) -> tuple[Note, ...] | None:
    """`notes` with the block freed by `note` told in its request's verification note, when that
    note is among the last ones and only other verifications come after it; else None."""
    for j in range(len(notes) - 1, -1, -1):
        if notes[j].kind != SPEC:
            return None
        if notes[j].request_id == note.request_id:
            return notes[:j] + (_join(notes[j], note),) + notes[j + 1 :]
    return None


def add_note(notes: tuple[Note, ...], note: Note | None) -> tuple[Note, ...]:
    """`notes` with `note` told after them, merged with the last ones where it belongs."""
    if note is None:
        return notes
    if note.kind == FREE:
        merged = _into_verification(notes, note)
        if merged is not None:
            return merged
    notes = notes + (note,)
    while len(notes) >= 2:
        merged = merge(notes[-2], notes[-1])
        if merged is None:
            break
        notes = notes[:-2] + (merged,)
    return notes
