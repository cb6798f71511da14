"""A `Note`: one line of a step's story, its kinds, and how it reads.

`narrative.py` makes the notes from a step's events and merges the runs of events that belong
together into one note; this module says what a note holds and how its text reads. A note keeps
the events' data, not only its text, so that merging a new event into it is exact; `text` is
built from that data when a view asks for it, and `blocks` names the physical blocks it is
about.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nanovllm.viz.words import count

# Note kinds.
ARRIVE, REJECT, SCHEDULE, DECODE = "arrive", "reject", "schedule", "decode"
TAKE, EVICT, HIT, CACHE, FREE = "take", "evict", "hit", "cache", "free"
WINDOW = "window"  # blocks a sliding window passed, freed while their request runs
PREEMPT, FINISH, TOKENS, SUMMARY, SNAPSHOT = "preempt", "finish", "tokens", "summary", "snapshot"
SPEC, GRAMMAR = "spec", "grammar"
EXEC = "exec"  # a stage of the model executor's step (`executor.py`)
SAVE, DROP, LOAD, LOAD_FAILED = "save", "drop", "load", "load_failed"  # the KV connector
SEND, RECEIVE, FETCH, LOCAL = "send", "receive", "fetch", "local"  # ... the P2pConnector


@dataclass(frozen=True)
class Note:
    """One line of a step's story. `first`/`last`: positions of its events in the step.

    `items` holds the kind's data, e.g. for TAKE `(logical index, block id, evicted owner)`;
    `detail` is a fixed phrase for kinds that need one.
    """

    kind: str
    request_id: str | None
    first: int
    last: int
    items: tuple = ()
    detail: str = ""
    count: int = 0  # items merged in, kept or not

    @property
    def blocks(self) -> tuple[int, ...]:
        """The physical blocks the note is about."""
        if self.kind in (TAKE, HIT, LOAD, FETCH):
            return tuple(item[1] for item in self.items)
        if self.kind in (EVICT, CACHE, FREE, WINDOW, PREEMPT, FINISH, SAVE, SEND):
            return tuple(item[0] for item in self.items)
        if self.kind == SPEC:  # items[0] is the verification; the rest are freed blocks
            return tuple(item[0] for item in self.items[1:])
        return ()

    @property
    def text(self) -> str:
        return _TEXT[self.kind](self)


def _ids(values) -> str:
    return " ".join(str(v) for v in values)


def _more(note: Note) -> str:
    extra = note.count - len(note.items)
    return f" … {extra} more" if extra > 0 else ""


def _span(values: list[int]) -> str:
    """`2` or `2-4` for consecutive logical indices, else the list."""
    if len(values) > 1 and values == list(range(values[0], values[0] + len(values))):
        return f"{values[0]}-{values[-1]}"
    return _ids(values)


def _arrive(n: Note) -> str:
    tokens, where, _ = n.items[0]
    place = (
        "first in the waiting queue"
        if where == 0
        else f"at the back of the waiting queue, {count(where, 'request')} ahead"
    )
    if n.count > 1:  # the children of one parent (parallel sampling)
        parent = n.request_id.split("_", 1)[1]
        children = _ids(item[2] for item in n.items) + _more(n)
        return (
            f"{parent} arrives with n={n.count}: children {children}, "
            f"{count(tokens, 'prompt token')} each, {place}"
        )
    return f"{n.request_id} arrives: {count(tokens, 'prompt token')}, {place}"


def _schedule(n: Note) -> str:
    tokens, computed, chunk, admitted = n.items[0]
    what = "prefill chunk" if chunk else "prefill"
    verb = "admitted" if admitted else "continues"
    text = f"{n.request_id} {verb}: {what} of {count(tokens, 'token')}"
    if computed:
        span = f"token {computed}" if tokens == 1 else f"tokens {computed}-{computed + tokens - 1}"
        text += f" ({span}; {computed} already in the cache)"
    if chunk:  # the scheduler cuts a prompt only to fit the step's token budget
        text += ", all the token budget left: the rest waits for the next step"
    return text


def _decode(n: Note) -> str:
    plain = [rid for rid, tokens in n.items if tokens == 1]
    parts = [f"one token each: {_ids(plain)}"] if plain else []
    verify = [f"{rid} 1+{tokens - 1}" for rid, tokens in n.items if tokens > 1]
    if verify:
        parts.append("with proposals to verify: " + " ".join(verify))
    return "decode, " + "; ".join(parts) + _more(n)


def _take(n: Note) -> str:
    logical = [item[0] for item in n.items]
    blocks = [item[1] for item in n.items]
    plural = "s" if len(blocks) > 1 else ""
    evicted = [(item[1], item[2]) for item in n.items if item[2]]
    where = "head of the free queue" if all(item[3] for item in n.items) else "the free queue"
    text = f"{n.request_id} logical block{plural} {_span(logical)} <- block{plural} "
    text += f"{_ids(blocks)}{_more(n)} ({where}"
    if len(evicted) == 1 and len(blocks) == 1:
        text += f"; evicts {_whose(evicted[0][1])} cached prefix"
    elif evicted:
        by_owner: dict[str, list[int]] = {}
        for block, owner in evicted:
            by_owner.setdefault(owner, []).append(block)
        text += "; evicts " + ", ".join(
            f"{_whose(owner)} cached prefix in {_ids(ids)}" for owner, ids in by_owner.items()
        )
    return text + ")"


def _whose(owner: str) -> str:
    return "an unknown request's" if owner == "?" else f"{owner}'s"


def _evict(n: Note) -> str:
    block, owner = n.items[0]
    return f"block {block} forgets {_whose(owner or '?')} cached prefix"


def _hit(n: Note) -> str:
    logical = [item[0] for item in n.items]
    pulled = [item[1] for item in n.items if item[2]]
    shared = [f"{item[1]} (now held by {item[3]})" for item in n.items if not item[2]]
    text = f"{n.request_id} prefix hit: logical {_span(logical)} <- blocks "
    text += f"{_ids(item[1] for item in n.items)}{_more(n)}"
    parts = []
    if pulled:
        parts.append(f"{_ids(pulled)} pulled from the middle of the free queue")
    if shared:
        parts.append("shared: " + ", ".join(shared))
    return text + (f" ({'; '.join(parts)})" if parts else "")


def _cache(n: Note) -> str:
    blocks = _ids(item[0] for item in n.items)
    return f"{n.request_id} registers full block{'s' if n.count > 1 else ''} {blocks}{_more(n)} in the prefix cache"


def _freed(n: Note) -> str:
    to_tail = [item[0] for item in n.items if item[1] == 0]
    kept = [(item[0], item[1]) for item in n.items if item[1] > 0]
    parts = []
    if to_tail:
        cached = [item[0] for item in n.items if item[1] == 0 and item[2]]
        part = f"block{'s' if len(to_tail) > 1 else ''} {_ids(to_tail)} to the tail"
        if cached:
            part += f" ({_ids(cached)} still cached)"
        parts.append(part)
    if kept:  # its ref count dropped, but other requests still hold it: it stays put
        parts.append(
            ", ".join(
                f"block {block} still held by {count(refs, 'other request')}"
                for block, refs in kept
            )
        )
    return "; ".join(parts) + _more(n)


def _free(n: Note) -> str:
    if all(item[1] > 0 for item in n.items):  # none freed: others still hold them
        return f"{n.request_id} lets go of its blocks: {_freed(n)}"
    return f"{n.request_id} frees {_freed(n)}"


def _window(n: Note) -> str:
    return f"{n.request_id}'s sliding window moved on: {_freed(n)}; ∅ (the null block) in its place"


def _preempt(n: Note) -> str:
    text = f"{n.request_id} preempted ({n.detail})"
    if n.items:
        text += f": {_freed(n)}"
    return text + "; back to the front of the waiting queue"


def _finish(n: Note) -> str:
    text = f"{n.request_id} finished ({n.detail})"
    return text + (f": {_freed(n)}" if n.items else "")


def _spec(n: Note) -> str:
    proposed, accepted = n.items[0]
    text = f"{n.request_id}: proposed {proposed}, "
    if accepted == proposed:
        return text + f"accepted {accepted} + 1 bonus token"
    text += f"accepted {accepted}, rejected {proposed - accepted} (+1 token of its own)"
    freed = replace(n, items=n.items[1:], count=n.count - 1)
    return text + (f"; {_freed(freed)}" if freed.items else "")


def _tokens(n: Note) -> str:
    return "sampled: " + ", ".join(f"{rid} {text!r}" for rid, text in n.items) + _more(n)


def _grammar(n: Note) -> str:
    """`A grammar allowed 12 of 320 tokens` (with proposals, one count per verified row)."""
    told = [f"{rid} grammar allowed {'/'.join(map(str, counts))}" for rid, counts in n.items]
    return "masked: " + ", ".join(told) + f" of {count(int(n.detail), 'token')}" + _more(n)


def _save(n: Note) -> str:
    if n.items[0][1] < 0:  # no tier: shared storage, for another engine (or a later run)
        blocks = _ids(item[0] for item in n.items) + _more(n)
        return (
            f"{n.request_id} saves blocks {blocks} to shared storage (another engine can load them)"
        )
    moves = ", ".join(f"block {block} -> slot {slot}" for block, slot, _, _ in n.items)
    text = f"host tier saves blocks the device pool hands out again: {moves}{_more(n)}"
    drops = [(slot, gone) for _, slot, _, gone in n.items if gone is not None]
    if drops:
        told = ", ".join(f"slot {slot} ({gone})" for slot, gone in drops)
        text += f"; the tier was full, so it dropped its least recently used: {told}"
    return text


def _drop(n: Note) -> str:
    slot, gone = n.items[0]
    return f"host tier full: slot {slot} drops its least recently used block ({gone})"


def _load(n: Note) -> str:
    if n.items[0][0] < 0:
        blocks = _ids(item[1] for item in n.items) + _more(n)
        return f"{n.request_id} loads blocks {blocks} from shared storage instead of computing them"
    moves = ", ".join(f"slot {slot} -> block {block}" for slot, block in n.items) + _more(n)
    return f"{n.request_id} host tier hit: {moves} (KV copied in before the forward pass, not computed)"


def _load_failed(n: Note) -> str:
    return (
        f"{n.request_id}: loading its KV failed ({n.detail}); the step is undone and it "
        "computes those tokens instead"
    )


def _hashes(n: Note) -> str:
    """The note's block hashes, short (the link's lines show the same)."""
    return "hash " + " ".join(item[-1][:6] for item in n.items) + _more(n)


def _send(n: Note) -> str:
    blocks = _ids(item[0] for item in n.items)
    return f"{n.request_id} sends blocks {blocks} to the decode engine ({_hashes(n)})"


def _receive(n: Note) -> str:
    return (
        f"{n.request_id}: blocks arrived from the prefill engine ({_hashes(n)}), staged in host "
        "memory"
    )


def _fetch(n: Note) -> str:
    blocks = _ids(item[0] for item in n.items)
    return (
        f"{n.request_id} loads blocks {blocks} from the KV the prefill engine sent "
        f"({_hashes(n)}), not computed"
    )


def _local(n: Note) -> str:
    return f"{n.request_id} computes its prompt locally because {n.detail}"


def _reject(n: Note) -> str:
    return f"{n.request_id} rejected: {n.detail}"


def _plain(n: Note) -> str:
    return n.detail


_TEXT = {
    ARRIVE: _arrive,
    REJECT: _reject,
    SCHEDULE: _schedule,
    DECODE: _decode,
    TAKE: _take,
    EVICT: _evict,
    HIT: _hit,
    CACHE: _cache,
    FREE: _free,
    WINDOW: _window,
    PREEMPT: _preempt,
    FINISH: _finish,
    TOKENS: _tokens,
    SPEC: _spec,
    GRAMMAR: _grammar,
    SAVE: _save,
    DROP: _drop,
    LOAD: _load,
    LOAD_FAILED: _load_failed,
    SEND: _send,
    RECEIVE: _receive,
    FETCH: _fetch,
    LOCAL: _local,
    SUMMARY: _plain,
    SNAPSHOT: _plain,
    EXEC: _plain,
}
