"""Typed engine events: every state change of the engine, as data.

The engine never draws anything and never knows who is watching. Instead, every time its state
changes (a request arrives, a block leaves the free queue, a token is sampled ...) it emits one
small frozen dataclass through a single subscription point, the `EventBus`. The visualizer, the
lessons, the server's `/events` stream and the tests all consume these events; none of them
reaches into engine internals. That keeps the dependency arrow pointing one way
(`nanovllm` <- `viz`, `lessons`) and makes a run replayable: a recorded list of events *is* the
run.

Cost when nobody listens: the engine checks `bus.active` (a plain attribute) before it builds an
event, so with no subscriber an event costs one attribute read.

Block events follow the free block queue exactly, so a consumer can rebuild the queue's order:
the queue starts as blocks 0..N-1 from head to tail; `BlockAllocated(from_free_queue=True)` takes
the head (preceded by `BlockEvicted` when that block still held a cached prefix), a `CacheHit`
with `was_free=True` pulls a block out of the middle, and `BlockFreed` with `ref_count == 0`
appends a block at the tail.

A consumer that joins a running engine (`nanovllm viz --connect`) first receives an
`EngineSnapshot`: the blocks, the free queue's order, the cached hashes and the requests at that
moment; the events after it apply on top.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    """Base class. `kind` names the event in traces (JSON lines) and on the wire."""

    kind: ClassVar[str] = "event"


# --- engine and request lifecycle ---------------------------------------------------------------


@dataclass(frozen=True)
class KVCacheGroupInfo:
    """One KV cache group as `EngineStarted` names it."""

    kind: str  # "full" or "sliding"
    sliding_window: int | None  # tokens a query sees in a sliding group, None in a full one
    layer_indices: tuple[int, ...]  # the layers that share the group's block tables


@dataclass(frozen=True)
class EngineStarted(Event):
    """The engine is ready: the shape of its KV cache and its scheduling limits."""

    kind: ClassVar[str] = "engine_started"
    model: str
    num_kv_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    attention_backend: str
    tensor_parallel_size: int = 1
    speculative_method: str | None = None  # e.g. "ngram", None: no speculative decoding
    num_speculative_tokens: int = 0
    # KV connector (`nanovllm/kv_transfer/`): its name, its role, and the blocks of its host tier
    # (OffloadingConnector's `num_cpu_blocks`; 0 without a tier).
    kv_connector: str | None = None
    kv_role: str | None = None
    num_tier_blocks: int = 0
    # The KV cache groups (`core/kv_cache_interface.py`), one block table each per request, in
    # the order of the events' `kv_cache_group_id`; () from a recording made before groups.
    kv_cache_groups: tuple[KVCacheGroupInfo, ...] = ()
    # The pool's null block (a sliding group's stand-in for blocks its window passed; it never
    # enters the free queue and has no owner), None when no group slides.
    null_block: int | None = None


@dataclass(frozen=True)
class RequestAdded(Event):
    kind: ClassVar[str] = "request_added"
    request_id: str
    prompt: str | None
    num_prompt_tokens: int
    max_tokens: int
    # The text of each prompt token, in order (what the visualizer writes into KV slots).
    prompt_tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class RequestRejected(Event):
    """`add_request` refused the request; nothing was allocated for it."""

    kind: ClassVar[str] = "request_rejected"
    request_id: str
    reason: str


@dataclass(frozen=True)
class RequestScheduled(Event):
    """The scheduler picked this request for the current step, for `num_tokens` tokens.

    `num_computed_tokens` is how many of its tokens already had KV in the cache before this step.
    A prefill is `is_prefill`; it is a *chunk* when it does not reach the end of the prompt.
    """

    kind: ClassVar[str] = "request_scheduled"
    step: int
    request_id: str
    num_tokens: int
    num_computed_tokens: int
    is_prefill: bool
    is_chunk: bool


@dataclass(frozen=True)
class RequestPreempted(Event):
    """Out of KV blocks: the request lost its blocks and went back to the front of the queue."""

    kind: ClassVar[str] = "request_preempted"
    step: int
    request_id: str
    num_computed_tokens_lost: int


@dataclass(frozen=True)
class TokenEmitted(Event):
    kind: ClassVar[str] = "token_emitted"
    step: int
    request_id: str
    token_id: int
    text_delta: str
    num_output_tokens: int


@dataclass(frozen=True)
class RequestFinished(Event):
    """`finish_reason` is one of "stop" (EOS, stop token or stop string), "length", "abort"."""

    kind: ClassVar[str] = "request_finished"
    step: int
    request_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int


# --- KV cache blocks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockAllocated(Event):
    """`request_id` now holds `block_id` as its logical block `logical_index`.

    `from_free_queue` is True when the block came off the head of the free queue (a fresh block);
    prefix-cache hits are reported as `CacheHit` instead.
    """

    kind: ClassVar[str] = "block_allocated"
    request_id: str
    block_id: int
    logical_index: int
    from_free_queue: bool = True
    kv_cache_group_id: int = 0  # which KV cache group's block table (`kv_cache_interface.py`)


@dataclass(frozen=True)
class CacheHit(Event):
    """A prefix-cache hit: the request reuses `block_id`, whose tokens match its own.

    `was_free` means the block sat in the free queue (ref count 0) and was pulled out of the
    middle; otherwise another running request holds it too and it is now shared.
    """

    kind: ClassVar[str] = "cache_hit"
    request_id: str
    block_id: int
    logical_index: int
    was_free: bool
    ref_count: int
    kv_cache_group_id: int = 0  # which KV cache group's block table (`kv_cache_interface.py`)


@dataclass(frozen=True)
class BlockFreed(Event):
    """`request_id` let go of `block_id`. At `ref_count == 0` the block joined the queue's tail.

    `cached` says the block keeps its prefix-cache hash (it can still be hit until evicted).
    """

    kind: ClassVar[str] = "block_freed"
    request_id: str
    block_id: int
    ref_count: int
    cached: bool
    kv_cache_group_id: int = 0  # which KV cache group's block table (`kv_cache_interface.py`)


@dataclass(frozen=True)
class BlockCached(Event):
    """A block became full and was registered in the prefix cache under its hash."""

    kind: ClassVar[str] = "block_cached"
    request_id: str
    block_id: int
    block_hash: str
    kv_cache_group_id: int = 0  # which KV cache group's block table (`kv_cache_interface.py`)


@dataclass(frozen=True)
class BlockEvicted(Event):
    """A cached-but-free block was handed out again, so its cached prefix is forgotten."""

    kind: ClassVar[str] = "block_evicted"
    block_id: int
    block_hash: str


# --- the KV connector: a second tier and KV across engines (`nanovllm/kv_transfer/`) ----------


@dataclass(frozen=True)
class KVBlockSaved(Event):
    """A device block's KV was copied out: into the host tier's slot `tier_slot`
    (OffloadingConnector, when the device pool evicts the block), to shared storage
    (SharedStorageConnector, `tier_slot` -1, for `request_id`), or onto the link to a consumer
    engine (P2pConnector, the same). Keyed by the block's hash."""

    kind: ClassVar[str] = "kv_block_saved"
    step: int
    block_id: int
    block_hash: str
    tier_slot: int = -1
    request_id: str | None = None


@dataclass(frozen=True)
class KVBlockLoaded(Event):
    """KV found outside the device pool (host tier slot `tier_slot`, or shared storage: -1) was
    copied into device block `block_id` of `request_id`, instead of being computed."""

    kind: ClassVar[str] = "kv_block_loaded"
    step: int
    request_id: str
    block_id: int
    block_hash: str
    tier_slot: int = -1


@dataclass(frozen=True)
class KVBlockReceived(Event):
    """A consumer engine received a block's KV from a producer engine (P2pConnector), sent for
    the proxy's transfer `transfer_id`; it waits in host memory until a request loads it."""

    kind: ClassVar[str] = "kv_block_received"
    step: int
    block_hash: str
    transfer_id: str


@dataclass(frozen=True)
class KVTierEvicted(Event):
    """The host tier was full: its least recently used block (`block_hash`, in `tier_slot`) was
    dropped to make room for a new one."""

    kind: ClassVar[str] = "kv_tier_evicted"
    step: int
    block_hash: str
    tier_slot: int


@dataclass(frozen=True)
class KVLoadFailed(Event):
    """Loading a request's external KV failed (`error` says how): its tokens are computed
    instead, from the step after this one."""

    kind: ClassVar[str] = "kv_load_failed"
    step: int
    request_id: str
    error: str


# --- once per step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecTokensVerified(Event):
    """Speculative decoding: the tokens proposed for a request this step, and how many of them
    (the first `num_accepted`) the target model accepted. The request also got one more token
    of its own (the correction, or a bonus when all were accepted)."""

    kind: ClassVar[str] = "spec_tokens_verified"
    step: int
    request_id: str
    proposed: tuple[int, ...]
    num_accepted: int


@dataclass(frozen=True)
class GrammarMasked(Event):
    """Structured outputs: this step's grammar masks. `allowed` maps each structured request to
    how many of the `vocab_size` tokens its grammar allowed, per logits row (one row, or 1 + k
    when it verifies k proposals; rows after a proposal the grammar refuses are not masked and
    not counted)."""

    kind: ClassVar[str] = "grammar_masked"
    step: int
    allowed: dict[str, tuple[int, ...]]
    vocab_size: int


# Why waiting requests wait (`StepSummary.waiting_reason`), in the scheduler's words.
WAITING_REASONS: dict[str, str] = {
    "max_num_seqs": "max_num_seqs requests already run",
    "no_free_block": "no free KV block for its tokens",
    "token_budget": "the step's token budget is spent",
    "preempted": "a request was preempted this step: memory is tight, nobody is admitted",
}


@dataclass(frozen=True)
class StepSummary(Event):
    """What one engine step did, and what the KV cache looks like afterwards.

    `scheduled` maps request id -> tokens computed this step. Times are seconds.
    KV usage: blocks `used` (ref count > 0), `cached_free` (free but still holding a cached
    prefix), `free` (everything in the free queue, cached ones included). Slots: token slots in
    allocated blocks vs slots that hold a token's KV (their gap is internal fragmentation).
    """

    kind: ClassVar[str] = "step_summary"
    step: int
    scheduled: dict[str, int]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_cached_free_blocks: int
    num_free_blocks: int
    num_allocated_slots: int
    num_filled_slots: int
    schedule_time: float
    forward_time: float
    num_preempted: int = 0
    token_budget: int = 0
    free_queue_head: tuple[int, ...] = field(default_factory=tuple)
    # Each tensor-parallel rank's forward time this step, in rank order (one without TP).
    rank_forward_times: tuple[float, ...] = field(default_factory=tuple)
    # Why the scheduler admitted no more (`nanovllm/core/waiting_reasons.py`): one of
    # WAITING_REASONS, None when nobody waits; `waiting_head` is the request it stopped at
    # (those behind it wait in arrival order). `budget_cut`: request id -> tokens it still
    # needed, for each request the token budget cut to a chunk this step.
    waiting_reason: str | None = None
    waiting_head: str | None = None
    budget_cut: dict[str, int] = field(default_factory=dict)
    # With "no_free_block": the blocks the head needed and the blocks free when the scheduler
    # decided (`num_free_blocks` counts them after the step, when finished requests freed more).
    waiting_blocks_needed: int | None = None
    waiting_free_blocks: int | None = None


# --- the model executor's step (`nanovllm/executor/step_events.py`) ---------------------------


@dataclass(frozen=True)
class StepInputsPrepared(Event):
    """The flat inputs the model runner built for `step`, as the model reads them: one entry
    per token (`input_ids`, `positions`, `slot_mapping` = block * `block_size` + offset), one per
    request in batch order (`request_ids`, `seq_lens`: its context length after the step,
    `block_tables`: the blocks its attention reads, `ceil(seq_len / block_size)` of them) and
    `query_start_loc` (request i's tokens are rows `query_start_loc[i]:query_start_loc[i + 1]`).
    `logits_rows` are the rows whose logits are computed; the first `num_sampled_rows` are
    sampled (the rest score prompt logprobs). A prefill chunk that does not reach the end of its
    prompt has no row."""

    kind: ClassVar[str] = "step_inputs_prepared"
    step: int
    block_size: int
    request_ids: tuple[str, ...]
    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    slot_mapping: tuple[int, ...]
    query_start_loc: tuple[int, ...]
    seq_lens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    logits_rows: tuple[int, ...]
    num_sampled_rows: int
    # A hybrid model's KV cache groups 1, 2, ... (`slot_mapping` and `block_tables` are group
    # 0's): each group's slot per token and block table per request; () with one group.
    group_slot_mappings: tuple[tuple[int, ...], ...] = ()
    group_block_tables: tuple[tuple[tuple[int, ...], ...], ...] = ()


@dataclass(frozen=True)
class KVWritten(Event):
    """Every layer wrote each new token's key and value into its slot (`slot_mapping`)."""

    kind: ClassVar[str] = "kv_written"
    step: int
    slot_mapping: tuple[int, ...]
    num_layers: int
    group_slot_mappings: tuple[tuple[int, ...], ...] = ()  # groups 1, 2, ... (a hybrid model's)


@dataclass(frozen=True)
class AttentionComputed(Event):
    """Paged attention ran: each request's queries read its `seq_lens[i]` tokens of context
    through its block table (`StepInputsPrepared.block_tables`), in every layer."""

    kind: ClassVar[str] = "attention_computed"
    step: int
    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]
    attention_backend: str


@dataclass(frozen=True)
class AttentionProbed(Event):
    """What paged attention computed in layer `layer` for one request's newest query (position
    `seq_len - 1`, the row that attends to the whole context), walking its `block_table`: per
    query head, each context token's score q·k × `scale`, the online softmax's running max and
    running sum after each block, and the final weights that combine the values
    (`nanovllm/executor/online_softmax.py`). Sent only while a probe is on
    (`LLMEngine.probe_attention`), read from the forward pass's own query and paged keys; query
    head h reads KV head h // (heads / `num_kv_heads`)."""

    kind: ClassVar[str] = "attention_probed"
    step: int
    request_id: str
    layer: int
    block_size: int
    seq_len: int
    block_table: tuple[int, ...]  # the blocks read, in logical order
    scale: float
    num_kv_heads: int
    scores: tuple[tuple[float, ...], ...]  # [heads][seq_len]
    running_max: tuple[tuple[float, ...], ...]  # [heads][blocks]: after each block
    running_sum: tuple[tuple[float, ...], ...]  # [heads][blocks]: relative to that max
    weights: tuple[tuple[float, ...], ...]  # [heads][seq_len]: the softmax, summing to 1


@dataclass(frozen=True)
class LogitsComputed(Event):
    """The LM head ran on `logits_rows` only: [len(logits_rows), vocab_size] logits."""

    kind: ClassVar[str] = "logits_computed"
    step: int
    logits_rows: tuple[int, ...]
    vocab_size: int


@dataclass(frozen=True)
class TokensSampled(Event):
    """The sampler's tokens, per sampling request in batch order (1 to k + 1 each)."""

    kind: ClassVar[str] = "tokens_sampled"
    step: int
    request_ids: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]


# --- a mixture of experts' routing (`executor/expert_load_events.py`) -----------------------


@dataclass(frozen=True)
class ExpertLoads(Event):
    """Where a mixture-of-experts model's router sent the step's tokens: for each sparse layer
    (`layers`, by index), how many tokens each expert received (`counts[i][e]`, `expert_load`
    in `models/moe.py`). Each token goes to `top_k` experts, so a layer's counts sum to
    `top_k` times the tokens the forward pass ran. With expert parallelism, `expert_ranks[e]`
    is the rank that holds expert e whole (`local_expert_range`); () when every rank holds a
    slice of every expert. Sent once per step, only by a model with sparse layers."""

    kind: ClassVar[str] = "expert_loads"
    step: int
    top_k: int
    layers: tuple[int, ...]
    counts: tuple[tuple[int, ...], ...]  # [len(layers)][num_experts]
    expert_ranks: tuple[int, ...] = ()


# --- a late subscriber's starting point -----------------------------------------------------------


@dataclass(frozen=True)
class BlockSnapshot:
    """One physical KV block in an `EngineSnapshot`."""

    block_id: int
    ref_count: int
    block_hash: str | None = None  # short id of its prefix-cache hash, while it has one


@dataclass(frozen=True)
class RequestSnapshot:
    """One unfinished request in an `EngineSnapshot`. `status` is "waiting" or "running"."""

    request_id: str
    status: str
    prompt: str | None
    num_prompt_tokens: int
    max_tokens: int
    num_computed_tokens: int
    num_output_tokens: int
    output_text: str
    block_table: tuple[int, ...]
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    tokens: tuple[str, ...] = ()  # the text of each token, prompt then output
    # The block tables of KV cache groups 1, 2, ... (`block_table` is group 0's; the null
    # block where a sliding window passed), () with one group.
    group_block_tables: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class EngineSnapshot(Event):
    """The engine's state at one moment, for a subscriber that joins a running engine.

    Sent right after `EngineStarted` to a late subscriber (the server's `/v1/events`), so that
    it starts from the truth instead of from a fresh engine. Plain data only: `blocks` in id
    order, `free_queue` head to tail, `waiting` front first, `running` in admission order, and
    the scheduler's counters so far.
    """

    kind: ClassVar[str] = "engine_snapshot"
    step: int
    blocks: tuple[BlockSnapshot, ...]
    free_queue: tuple[int, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    requests: tuple[RequestSnapshot, ...]
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_hits: int = 0
    # The OffloadingConnector's host tier: (short hash, slot) per entry, least recently used first.
    tier: tuple[tuple[str, int], ...] = ()


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        EngineStarted,
        RequestAdded,
        RequestRejected,
        RequestScheduled,
        RequestPreempted,
        TokenEmitted,
        RequestFinished,
        BlockAllocated,
        CacheHit,
        BlockFreed,
        BlockCached,
        BlockEvicted,
        KVBlockSaved,
        KVBlockLoaded,
        KVTierEvicted,
        KVLoadFailed,
        KVBlockReceived,
        SpecTokensVerified,
        GrammarMasked,
        StepSummary,
        EngineSnapshot,
        StepInputsPrepared,
        KVWritten,
        AttentionComputed,
        AttentionProbed,
        LogitsComputed,
        TokensSampled,
        ExpertLoads,
    )
}


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict: the event's fields plus `"kind"`."""
    data = dataclasses.asdict(event)
    data["kind"] = event.kind
    return data


def event_from_dict(data: dict[str, Any]) -> Event:
    """Inverse of `event_to_dict` (tuples come back from JSON as lists; fix those)."""
    data = dict(data)
    cls = EVENT_TYPES.get(data.pop("kind", ""))
    if cls is None:
        raise ValueError(f"unknown event kind in {data!r}")
    return _from_fields(cls, data)


# The dataclasses nested in an event's tuple fields.
_NESTED: dict[tuple[type, str], type] = {
    (EngineSnapshot, "blocks"): BlockSnapshot,
    (EngineSnapshot, "requests"): RequestSnapshot,
    (EngineStarted, "kv_cache_groups"): KVCacheGroupInfo,
}


def _tuples(value: Any) -> Any:
    """JSON's lists, nested to any depth, as the tuples they were."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _from_fields(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in names}
    for name, value in kwargs.items():
        if isinstance(value, list):
            nested = _NESTED.get((cls, name))
            if nested is not None:
                value = [_from_fields(nested, item) for item in value]
            else:  # (tuples of tuples: EngineSnapshot.tier, group_block_tables)
                value = [_tuples(v) for v in value]
            kwargs[name] = tuple(value)
        elif isinstance(value, dict):  # (a dict of tuples: GrammarMasked.allowed)
            kwargs[name] = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return cls(**kwargs)


Subscriber = Callable[[Event], None]


class EventBus:
    """The engine's one subscription point.

    `subscribe(fn)` returns a function that unsubscribes. `emit` calls every subscriber in
    order. A subscriber that raises is *reported* (to stderr and in `errors`) and never raised
    into the engine step: a broken visualizer must not kill a server.

    Inside `with bus.holding() as held:` the events emitted are collected in `held` instead of
    delivered; `deliver(held)` tells them later. Async scheduling (`engine/async_step.py`) holds
    a step's events while it runs ahead, so that they reach subscribers in the plain loop's order.
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self.active = False  # read by emitters before they build an event
        self.errors: list[str] = []
        self._held: list[Event] | None = None  # while not None, `emit` collects here

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self._subscribers.append(fn)
        self.active = True

        def unsubscribe() -> None:
            if fn in self._subscribers:
                self._subscribers.remove(fn)
            self.active = bool(self._subscribers)

        return unsubscribe

    def emit(self, event: Event) -> None:
        if self._held is not None:
            self._held.append(event)
        else:
            self.deliver((event,))

    def deliver(self, events: Iterable[Event]) -> None:
        """Tell every subscriber these events, in order, now (even inside `holding`)."""
        for event in events:
            for fn in list(self._subscribers):
                self.send_to(fn, event)

    @contextmanager
    def holding(self, into: list[Event] | None = None) -> Iterator[list[Event]]:
        """Collect the events emitted inside the block (appended to `into`, or a new list) instead
        of delivering them; the list is yielded. Nested, the inner block collects its own."""
        before, self._held = self._held, [] if into is None else into
        try:
            yield self._held
        finally:
            self._held = before

    def send_to(self, fn: Subscriber, event: Event) -> None:
        """Deliver one event to one subscriber, reporting (not raising) what it raises."""
        try:
            fn(event)
        except Exception as exc:  # noqa: BLE001 - a subscriber's bug is reported, not raised
            message = f"event subscriber {fn!r} raised {type(exc).__name__}: {exc}"
            if len(self.errors) < 100:
                self.errors.append(message)
            print(message, file=sys.stderr)
            traceback.print_exc(limit=3, file=sys.stderr)
