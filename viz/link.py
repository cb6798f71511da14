"""The link between a prefill engine and a decode engine, rebuilt from their tagged events.

In the `disagg` scenario two engines run side by side (`disagg.py`): a producer (kv_producer)
computes each prompt and sends its full KV blocks over the P2pConnector's link; a consumer
(kv_consumer) receives them, loads them into its own blocks and decodes. Each engine's events
are tagged with the engine they came from (`Tagged`, at the driver: the engines do not know
of each other), and four of them tell a block's crossing:

    prefill  KVBlockSaved(block_id, block_hash, request_id)   sent: on the link
    decode   KVBlockReceived(block_hash, transfer_id)          arrived, staged in host memory
    decode   KVBlockLoaded(request_id, block_id, block_hash)   copied into a consumer block
    decode   KVLoadFailed(request_id, error)                   its prompt is computed locally

`LinkState` counts them and keeps the latest `MAX_CROSSINGS` crossings, one per block sent,
most recent last. A block hash names its tokens and every token before them (a prefix hash),
so the two engines agree on it: an arrival or a load is matched to the most recent crossing
of its hash that has not got that far yet. (Two crossings of one hash carry the same KV, so
which of them an arrival completes changes nothing but the line drawn.) Matching the most
recent one means a crossing that fell off the list would never have been matched while a kept
one could: the list is exactly the last `MAX_CROSSINGS` crossings of the whole run.

`reduce_link` is pure, like `state.reduce`; events of other kinds leave the state as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nanovllm.events import Event, KVBlockLoaded, KVBlockReceived, KVBlockSaved, KVLoadFailed

PREFILL, DECODE = "prefill", "decode"  # the engines, as `Tagged.engine` names them
SENT, RECEIVED, LOADED = "sent", "received", "loaded"  # how far a crossing got
MAX_CROSSINGS = 12
MAX_FAILURES = 4  # (request id, error), most recent last


@dataclass(frozen=True)
class Tagged:
    """An event and the engine it came from (`PREFILL` or `DECODE`)."""

    engine: str
    event: Event


@dataclass(frozen=True)
class Crossing:
    """One block sent by the prefill engine, and how far it got."""

    block_hash: str  # short hash (`core/block_hash.short`)
    request_id: str | None  # the prefill engine's request that sent it
    src_block: int  # the prefill engine's block
    stage: str = SENT
    transfer_id: str | None = None  # once received
    dst_request_id: str | None = None  # once loaded: the decode engine's request ...
    dst_block: int | None = None  # ... and block


@dataclass(frozen=True)
class LinkState:
    num_sent: int = 0
    num_received: int = 0
    num_loaded: int = 0
    num_failed: int = 0  # decode requests whose transfer failed (computed locally)
    crossings: tuple[Crossing, ...] = ()  # the latest, most recent last
    failures: tuple[tuple[str, str], ...] = ()

    @property
    def in_flight(self) -> int:
        """Crossings on the list sent but not yet arrived."""
        return sum(1 for c in self.crossings if c.stage == SENT)


def _match(crossings: tuple[Crossing, ...], block_hash: str, stages: tuple[str, ...]) -> int:
    """The index of the most recent crossing of `block_hash` at one of `stages`, or -1."""
    for i in range(len(crossings) - 1, -1, -1):
        if crossings[i].block_hash == block_hash and crossings[i].stage in stages:
            return i
    return -1


def _update(crossings: tuple[Crossing, ...], i: int, **changes) -> tuple[Crossing, ...]:
    return crossings[:i] + (replace(crossings[i], **changes),) + crossings[i + 1 :]


def reduce_link(link: LinkState, tagged: Tagged) -> LinkState:
    """The link after `tagged`. Pure: `link` is left as it was."""
    e, crossings = tagged.event, link.crossings
    if tagged.engine == PREFILL and isinstance(e, KVBlockSaved):
        crossing = Crossing(e.block_hash, e.request_id, e.block_id)
        return replace(
            link,
            num_sent=link.num_sent + 1,
            crossings=(crossings + (crossing,))[-MAX_CROSSINGS:],
        )
    if tagged.engine != DECODE:
        return link
    if isinstance(e, KVBlockReceived):
        i = _match(crossings, e.block_hash, (SENT,))
        if i >= 0:
            crossings = _update(crossings, i, stage=RECEIVED, transfer_id=e.transfer_id)
        return replace(link, num_received=link.num_received + 1, crossings=crossings)
    if isinstance(e, KVBlockLoaded):
        i = _match(crossings, e.block_hash, (SENT, RECEIVED))
        if i >= 0:
            crossings = _update(
                crossings, i, stage=LOADED, dst_request_id=e.request_id, dst_block=e.block_id
            )
        return replace(link, num_loaded=link.num_loaded + 1, crossings=crossings)
    if isinstance(e, KVLoadFailed):
        failures = (link.failures + ((e.request_id, e.error),))[-MAX_FAILURES:]
        return replace(link, num_failed=link.num_failed + 1, failures=failures)
    return link


def crossing_line(c: Crossing, compact: bool = False) -> str:
    """`b3 (prefill) ──> hash a1b2c3 ──> b7 (decode)`; `…` where the block has not got yet.
    Compact, for a narrow link: `b3 ─a1b2c3─> b7`."""
    if c.stage == LOADED:
        end = f"b{c.dst_block}" if compact else f"b{c.dst_block} (decode)"
    elif c.stage == RECEIVED:
        end = "staged"
    else:
        end = "…"
    if compact:
        return f"b{c.src_block} ─{c.block_hash[:6]}─> {end}"
    return f"b{c.src_block} (prefill) ──> hash {c.block_hash[:6]} ──> {end}"
