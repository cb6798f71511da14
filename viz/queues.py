"""The queues panel's state: every request the events told of, and the queues they stand in.

`QueuesState` is one panel of `VizState` (`state.py`): the requests by id, the waiting queue
(front first), the running requests in admission order (the last one is preempted first), the
finished ones kept for the view, the rejected ones, the families of parallel sampling
(`families.py`) and why the waiting requests wait (`waiting.py`). `reduce_queues` is its pure
reducer; `state.reduce` calls it only for the events in `QUEUE_EVENTS`, so any other event
leaves this panel the very same object.

A request event replaces its own `RequestInfo` in a new mapping that shares every other entry
with the old one; a block event changes only the block table of the request it names.

Besides its own panel the reducer reads the blocks panel as it was before the event
(`blocks.py`): a new request's slot avoids the requests whose cached prefix a block keeps, and
a block event naming a block the pool does not have is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from nanovllm.events import (
    BlockAllocated,
    BlockFreed,
    CacheHit,
    EngineSnapshot,
    Event,
    GrammarMasked,
    RequestAdded,
    RequestFinished,
    RequestPreempted,
    RequestRejected,
    RequestScheduled,
    SpecTokensVerified,
    StepSummary,
    TokenEmitted,
)
from nanovllm.viz.blocks import BlocksState, snapshot_order
from nanovllm.viz.families import follows, group_children
from nanovllm.viz.frozen import evolve, without

# Request status, as the visualizer tells it.
WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"

MAX_FINISHED = 40  # finished requests kept (with their text) for the queue view
MAX_REJECTED = 5
NUM_SLOTS = 36  # letters in `style.GLYPHS`

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class RequestInfo:
    """One request, as far as events tell."""

    request_id: str
    index: int  # arrival order from 0: orders the timeline's rows
    prompt: str | None
    num_prompt_tokens: int
    max_tokens: int
    status: str = WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (after the last step)
    num_output_tokens: int = 0
    output_text: str = ""
    block_table: tuple[int, ...] = ()  # logical block i lives in physical block block_table[i]
    # The block tables of KV cache groups 1, 2, ... (`block_table` is group 0's): one per
    # group of a hybrid model; a sliding group's blocks behind its window read as the null block.
    group_block_tables: tuple[tuple[int, ...], ...] = ()
    tokens: tuple[str, ...] = ()  # text of each token (prompt, then output) when events tell
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at its last admission
    num_preemptions: int = 0
    finish_reason: str | None = None
    # Speculative decoding: tokens proposed for it and accepted, and where the accepted ones
    # sit: (position of the first, how many) per verification that accepted any.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted: tuple[tuple[int, int], ...] = ()
    # Structured outputs: how many tokens its grammar allowed at its last masked step (per
    # logits row: 1 + the proposals verified), and of how many; None: never masked.
    grammar_allowed: tuple[int, ...] | None = None
    vocab_size: int = 0
    # Picks its colour and letter (`style.py`): at arrival, the lowest that no live request
    # and no cached prefix's request holds (`free_slot`), so letters on screen do not repeat.
    slot: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def block_tables(self) -> tuple[tuple[int, ...], ...]:
        """One block table per KV cache group, group 0's first."""
        return (self.block_table, *self.group_block_tables)

    def with_block_table(self, group: int, table: tuple[int, ...]) -> RequestInfo:
        """This request with KV cache group `group`'s block table replaced."""
        if group == 0:
            return evolve(self, block_table=table)
        others = self.group_block_tables + ((),) * (group - len(self.group_block_tables))
        return evolve(self, group_block_tables=others[: group - 1] + (table,) + others[group:])

    def accepted_positions(self) -> frozenset[int]:
        """Positions (in prompt + output) of the tokens that were accepted proposals."""
        return frozenset(t for start, n in self.accepted for t in range(start, start + n))


@dataclass(frozen=True)
class QueuesState:
    """The requests and the queues they stand in."""

    requests: Mapping[str, RequestInfo] = field(default_factory=lambda: _EMPTY)
    waiting: tuple[str, ...] = ()  # front of the queue first
    running: tuple[str, ...] = ()  # in admission order (the last one is preempted first)
    finished: tuple[str, ...] = ()  # most recent last, at most MAX_FINISHED
    num_arrivals: int = 0
    rejected: tuple[tuple[str, str], ...] = ()  # (request id, reason), most recent last
    # Parallel sampling: parent id -> its children's ids by index (families of two or more).
    families: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    last_added: str | None = None  # the latest RequestAdded's id (children arrive in a row)
    # Why the waiting requests wait, as the last `StepSummary` said (`waiting.py`).
    waiting_reason: str | None = None
    waiting_head: str | None = None


def reduce_queues(queues: QueuesState, event: Event, kv: BlocksState) -> QueuesState:
    """The queues after `event`; `kv` is the blocks panel before it (read, never changed)."""
    return _HANDLERS[type(event)](queues, event, kv)


def _set(queues: QueuesState, info: RequestInfo) -> Mapping[str, RequestInfo]:
    return MappingProxyType({**queues.requests, info.request_id: info})


def free_slot(queues: QueuesState, kv: BlocksState) -> int:
    """The slot (colour and letter) for a new request: the lowest that no waiting or running
    request holds, nor the request whose cached prefix a block keeps; if possible none that a
    listed finished request holds either."""
    requests = queues.requests
    live = {r.slot for r in requests.values() if r.status != FINISHED}
    cached = {requests[b.cached_by].slot for b in kv.blocks if b.cached and b.cached_by in requests}
    listed = {r.slot for r in requests.values()}
    for avoid in (live | cached | listed, live | cached, live):
        for slot in range(NUM_SLOTS):
            if slot not in avoid:
                return slot
    return queues.num_arrivals % NUM_SLOTS


def _on_request_added(q: QueuesState, e: RequestAdded, kv: BlocksState) -> QueuesState:
    info = RequestInfo(
        request_id=e.request_id,
        index=q.num_arrivals,
        slot=free_slot(q, kv),
        prompt=e.prompt,
        num_prompt_tokens=e.num_prompt_tokens,
        max_tokens=e.max_tokens,
        tokens=e.prompt_tokens,
    )
    families = q.families
    parent = follows(q.last_added, e.request_id)
    if parent is not None:
        members = families.get(parent, ())
        if not members or members[-1] != q.last_added:  # child 1: a new family
            members = (q.last_added,)
        families = MappingProxyType({**families, parent: members + (e.request_id,)})
    return evolve(
        q,
        requests=_set(q, info),
        waiting=q.waiting + (e.request_id,),
        num_arrivals=q.num_arrivals + 1,
        families=families,
        last_added=e.request_id,
    )


def _on_request_rejected(q: QueuesState, e: RequestRejected, kv: BlocksState) -> QueuesState:
    # The request never entered the engine (its id may even belong to another request).
    return evolve(q, rejected=(q.rejected + ((e.request_id, e.reason),))[-MAX_REJECTED:])


def _on_request_scheduled(q: QueuesState, e: RequestScheduled, kv: BlocksState) -> QueuesState:
    info = q.requests.get(e.request_id)
    if info is None:
        return q
    new_info = evolve(info, num_computed_tokens=e.num_computed_tokens + e.num_tokens)
    if info.status != WAITING:
        return evolve(q, requests=_set(q, new_info))
    # Admitted this step.
    new_info = evolve(new_info, status=RUNNING, num_cached_tokens=e.num_computed_tokens)
    return evolve(
        q,
        requests=_set(q, new_info),
        waiting=without(q.waiting, e.request_id),
        running=q.running + (e.request_id,),
    )


def _on_request_preempted(q: QueuesState, e: RequestPreempted, kv: BlocksState) -> QueuesState:
    info = q.requests.get(e.request_id)
    if info is None:
        return q
    new_info = evolve(
        info,
        status=WAITING,
        num_computed_tokens=0,
        block_table=(),
        group_block_tables=(),
        num_preemptions=info.num_preemptions + 1,
    )
    return evolve(
        q,
        requests=_set(q, new_info),
        running=without(q.running, e.request_id),
        waiting=(e.request_id,) + without(q.waiting, e.request_id),  # back to the front
    )


def _on_token_emitted(q: QueuesState, e: TokenEmitted, kv: BlocksState) -> QueuesState:
    info = q.requests.get(e.request_id)
    if info is None:
        return q
    new_info = evolve(
        info,
        num_output_tokens=e.num_output_tokens,
        output_text=info.output_text + e.text_delta,
        tokens=info.tokens + (e.text_delta,) if info.tokens else (),
    )
    return evolve(q, requests=_set(q, new_info))


def _on_request_finished(q: QueuesState, e: RequestFinished, kv: BlocksState) -> QueuesState:
    info = q.requests.get(e.request_id)
    if info is None:
        return q
    new_info = evolve(
        info,
        status=FINISHED,
        finish_reason=e.finish_reason,
        num_output_tokens=e.num_output_tokens,
        block_table=(),
        group_block_tables=(),
    )
    requests = dict(q.requests)
    requests[e.request_id] = new_info
    finished = q.finished + (e.request_id,)
    families = q.families
    if len(finished) > MAX_FINISHED:  # forget the oldest finished requests
        for old in finished[:-MAX_FINISHED]:
            requests.pop(old, None)
        finished = finished[-MAX_FINISHED:]
        families = MappingProxyType(
            {p: ids for p, ids in families.items() if any(r in requests for r in ids)}
        )
    return evolve(
        q,
        requests=MappingProxyType(requests),
        running=without(q.running, e.request_id),
        waiting=without(q.waiting, e.request_id),
        finished=finished,
        families=families,
    )


def _valid_block(kv: BlocksState, block_id: int) -> bool:
    return 0 <= block_id < len(kv.blocks)


def _on_block_taken(q: QueuesState, e: BlockAllocated | CacheHit, kv: BlocksState) -> QueuesState:
    """The request holds the block as its logical block `e.logical_index` now."""
    info = q.requests.get(e.request_id)
    if info is None or not _valid_block(kv, e.block_id):
        return q
    group = e.kv_cache_group_id
    table = info.block_tables[group] if group < len(info.block_tables) else ()
    # A sliding group's prefix hit starts with null blocks, which no event names.
    gap = (kv.null_block,) * (e.logical_index - len(table)) if kv.null_block is not None else ()
    table = table[: e.logical_index] + gap + (e.block_id,)
    return evolve(q, requests=_set(q, info.with_block_table(group, table)))


def _on_block_freed(q: QueuesState, e: BlockFreed, kv: BlocksState) -> QueuesState:
    # Out of the request's block table: a finishing or preempted request's table empties
    # block by block (tail first), and a running request loses the blocks that held only its
    # rejected proposals.
    # With a null block (some group slides), a block freed inside the table is one a window
    # passed: the null block takes its place, and only the tail shrinks.
    info = q.requests.get(e.request_id)
    group = e.kv_cache_group_id
    if info is None or group >= len(info.block_tables) or not _valid_block(kv, e.block_id):
        return q
    table = info.block_tables[group]
    if e.block_id not in table:
        return q
    if kv.null_block is None:
        table = without(table, e.block_id)
    else:
        i = table.index(e.block_id)
        table = table[:i] + (kv.null_block,) + table[i + 1 :]
        while table and table[-1] == kv.null_block:
            table = table[:-1]
    return evolve(q, requests=_set(q, info.with_block_table(group, table)))


def _on_spec_tokens_verified(q: QueuesState, e: SpecTokensVerified, kv: BlocksState) -> QueuesState:
    """The first `num_accepted` proposals were accepted: the rest are rolled back."""
    info = q.requests.get(e.request_id)
    if info is None:
        return q
    proposed, accepted = len(e.proposed), e.num_accepted
    # The accepted tokens come next, as the request's next output tokens (`TokenEmitted`).
    spans = info.accepted + ((info.num_tokens, accepted),) if accepted else info.accepted
    new_info = evolve(
        info,
        num_computed_tokens=max(0, info.num_computed_tokens - (proposed - accepted)),
        num_draft_tokens=info.num_draft_tokens + proposed,
        num_accepted_tokens=info.num_accepted_tokens + accepted,
        accepted=spans,
    )
    return evolve(q, requests=_set(q, new_info))


def _on_grammar_masked(q: QueuesState, e: GrammarMasked, kv: BlocksState) -> QueuesState:
    """Each structured request's latest mask: how many tokens its grammar allowed."""
    for rid, counts in e.allowed.items():
        info = q.requests.get(rid)
        if info is not None:
            info = evolve(info, grammar_allowed=counts, vocab_size=e.vocab_size)
            q = evolve(q, requests=_set(q, info))
    return q


def _on_step_summary(q: QueuesState, e: StepSummary, kv: BlocksState) -> QueuesState:
    if (q.waiting_reason, q.waiting_head) == (e.waiting_reason, e.waiting_head):
        return q
    return evolve(q, waiting_reason=e.waiting_reason, waiting_head=e.waiting_head)


def _on_engine_snapshot(q: QueuesState, e: EngineSnapshot, kv: BlocksState) -> QueuesState:
    """A late subscriber's start: the engine's requests and queues replace ours."""
    requests: dict[str, RequestInfo] = {}
    for r in snapshot_order(e):
        requests[r.request_id] = RequestInfo(
            request_id=r.request_id,
            index=len(requests),
            slot=len(requests) % NUM_SLOTS,
            prompt=r.prompt,
            num_prompt_tokens=r.num_prompt_tokens,
            max_tokens=r.max_tokens,
            status=RUNNING if r.status == RUNNING else WAITING,
            num_computed_tokens=r.num_computed_tokens,
            num_output_tokens=r.num_output_tokens,
            output_text=r.output_text,
            block_table=r.block_table,
            group_block_tables=r.group_block_tables,
            tokens=r.tokens,
            num_cached_tokens=r.num_cached_tokens,
            num_preemptions=r.num_preemptions,
        )
    return evolve(
        q,
        requests=MappingProxyType(requests),
        waiting=tuple(r for r in e.waiting if r in requests),
        running=tuple(r for r in e.running if r in requests),
        finished=(),
        num_arrivals=len(requests),
        rejected=(),
        families=MappingProxyType(group_children(requests)),
        last_added=None,
    )


_HANDLERS: dict[type, Callable[[QueuesState, Event, BlocksState], QueuesState]] = {
    RequestAdded: _on_request_added,
    RequestRejected: _on_request_rejected,
    RequestScheduled: _on_request_scheduled,
    RequestPreempted: _on_request_preempted,
    TokenEmitted: _on_token_emitted,
    RequestFinished: _on_request_finished,
    BlockAllocated: _on_block_taken,
    CacheHit: _on_block_taken,
    BlockFreed: _on_block_freed,
    SpecTokensVerified: _on_spec_tokens_verified,
    GrammarMasked: _on_grammar_masked,
    StepSummary: _on_step_summary,
    EngineSnapshot: _on_engine_snapshot,
}
QUEUE_EVENTS = frozenset(_HANDLERS)
