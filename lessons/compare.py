"""Two runs of the engine, compared step by step from their events, and the first difference in
words: what `nanovllm lesson N --run` compares besides the completions.

Two engines that produce the same completions can still decide differently: a scheduler that
admits a shorter request ahead of the queue's head, or a block count one too high, changes no
token, only which request runs when and which block it takes. So a run is read back from its
events (`nanovllm.events`), one `Step` per engine step, and each lesson compares the part its
code decides (`ASPECTS`, named by `COMPARE` in the lesson's `run.py`):

    schedule       which requests each step ran, how many tokens each, and which it preempted
    blocks         the blocks each request was handed, hit in the prefix cache and gave back,
                   how many it then held, and how many blocks the free queue counted
    cache_hits     the prefix-cache hits alone
    tier           every block saved to the host tier, dropped from it and loaded back, by hash
                   (not by slot: which free slot a tier takes is its own business)
    verifications  every verification of a request's proposed tokens, and how many it accepted

Whatever the lesson, `broken_invariant` reads what every run must keep: no step of 0 tokens,
and blocks conserved.

The events of one step are those after the previous `StepSummary` up to its own. `first_difference`
names the first step at which the two runs differ, and what differs there, request by request.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

MAX_LINES = 6  # differences shown for one step; the rest are counted


@dataclass
class Step:
    """One engine step, as its events tell it (request ids as keys)."""

    number: int
    scheduled: dict[str, int] = field(default_factory=dict)  # tokens, in scheduling order
    preempted: list[str] = field(default_factory=list)
    handed: dict[str, list[int]] = field(default_factory=dict)  # fresh blocks from the queue
    hit: dict[str, list[int]] = field(default_factory=dict)  # prefix-cache hits
    freed: dict[str, list[int]] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)  # blocks held after the step
    tokens: dict[str, int] = field(default_factory=dict)  # tokens computed after the step
    free_blocks: int = 0  # what the free block queue counted after the step
    tier: list[str] = field(default_factory=list)  # the host tier's saves, drops, loads


def steps_of(events: list) -> list[Step]:
    """The run's steps, in order, from its events."""
    steps: list[Step] = []
    step = Step(1)
    held: dict[str, int] = {}
    for e in events:
        name = type(e).__name__
        if name == "RequestScheduled":
            step.tokens[e.request_id] = e.num_computed_tokens + e.num_tokens
        elif name == "RequestPreempted":
            step.preempted.append(e.request_id)
        elif name in ("BlockAllocated", "CacheHit", "BlockFreed"):
            kind = {"BlockAllocated": step.handed, "CacheHit": step.hit, "BlockFreed": step.freed}
            kind[name].setdefault(e.request_id, []).append(e.block_id)
            held[e.request_id] = held.get(e.request_id, 0) + (-1 if name == "BlockFreed" else 1)
        elif name == "KVBlockSaved":
            step.tier.append(f"block {e.block_id} saved as {e.block_hash}")
        elif name == "KVTierEvicted":
            step.tier.append(f"{e.block_hash} dropped from the tier")
        elif name == "KVBlockLoaded":
            step.tier.append(f"{e.request_id} loaded {e.block_hash} into block {e.block_id}")
        elif name == "StepSummary":
            step.number, step.scheduled = e.step, dict(e.scheduled)
            step.free_blocks = e.num_free_blocks
            step.held = {rid: n for rid, n in held.items() if n}
            steps.append(step)
            step = Step(e.step + 1)
    return steps


# --- one step against the other, in words ------------------------------------------------------


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _tokens(n: int) -> str:
    return _count(n, "token")


def _blocks(ids: list[int]) -> str:
    if not ids:
        return "no block"
    return f"block {ids[0]}" if len(ids) == 1 else f"blocks {', '.join(map(str, ids))}"


def _ran(scheduled: dict[str, int]) -> str:
    ids = list(scheduled)
    shown = ", ".join(ids[:8]) + (", ..." if len(ids) > 8 else "")
    return f"{len(ids)} requests, {_tokens(sum(scheduled.values()))} ({shown})"


def _schedule(a: Step, b: Step) -> list[str]:
    lines = []
    if set(a.scheduled) != set(b.scheduled):
        lines.append(f"the stock scheduler ran {_ran(a.scheduled)}; yours ran {_ran(b.scheduled)}")
    for rid in dict.fromkeys([*a.scheduled, *b.scheduled]):
        want, got = a.scheduled.get(rid), b.scheduled.get(rid)
        if want == got:
            continue
        if got is None:
            lines.append(
                f"{rid}: the stock scheduler gave it {_tokens(want)}; yours did not run it"
            )
        elif want is None:
            lines.append(f"{rid}: yours gave it {_tokens(got)}; the stock scheduler did not run it")
        else:
            lines.append(
                f"{rid}: the stock scheduler gave it {_tokens(want)}, yours {_tokens(got)}"
            )
    if not lines and list(a.scheduled) != list(b.scheduled):
        lines.append(
            f"the same requests in another order: the stock scheduler's {', '.join(a.scheduled)}; "
            f"yours {', '.join(b.scheduled)}"
        )
    if a.preempted != b.preempted:
        lines.append(
            f"preempted by the stock scheduler: {', '.join(a.preempted) or 'none'}; by yours: "
            f"{', '.join(b.preempted) or 'none'}"
        )
    return lines


def _block_changes(a: Step, b: Step, kinds: tuple[str, ...], held: bool = False) -> list[str]:
    """Each request's blocks of `kinds` that differ, and with `held`, how many it then held."""
    words = {"handed": "was handed", "hit": "hit in the prefix cache", "freed": "gave back"}
    lines = []
    requests = [*a.handed, *a.hit, *a.freed, *a.held, *b.handed, *b.hit, *b.freed, *b.held]
    for rid in dict.fromkeys(requests):
        for kind in kinds:
            want, got = getattr(a, kind).get(rid, []), getattr(b, kind).get(rid, [])
            if want != got:
                lines.append(
                    f"{rid} {words[kind]} {_blocks(want)} in the stock engine, {_blocks(got)} in yours"
                )
        if held and a.held.get(rid, 0) != b.held.get(rid, 0):
            tokens = a.tokens.get(rid)
            same = tokens is not None and tokens == b.tokens.get(rid)
            has = f" (it had {_tokens(tokens)} after the step)" if same else ""
            lines.append(
                f"{rid} then held {_count(a.held.get(rid, 0), 'block')} in the stock engine, "
                f"{b.held.get(rid, 0)} in yours{has}"
            )
    return lines


def _blocks_and_queue(a: Step, b: Step) -> list[str]:
    lines = _block_changes(a, b, ("handed", "hit", "freed"), held=True)
    if a.free_blocks != b.free_blocks:
        lines.append(
            f"the free block queue then counted {a.free_blocks} free blocks in the stock engine, "
            f"{b.free_blocks} in yours"
        )
    return lines


def _cache_hits(a: Step, b: Step) -> list[str]:
    return _block_changes(a, b, ("hit",))


def _tier(a: Step, b: Step) -> list[str]:
    if a.tier == b.tier:
        return []
    lines = [f"only in the stock engine: {x}" for x in a.tier if x not in b.tier]
    lines += [f"only in yours: {x}" for x in b.tier if x not in a.tier]
    if not lines:  # the same saves, drops and loads, in another order
        i = next(i for i, (x, y) in enumerate(zip(a.tier, b.tier)) if x != y)
        lines = [
            f"the same, in another order: the stock engine's tier did {i + 1}. {a.tier[i]}, "
            f"yours {i + 1}. {b.tier[i]}"
        ]
    return lines


ASPECTS: dict[str, tuple[str, Callable[[Step, Step], list[str]]]] = {
    "schedule": ("every step's scheduling decisions", _schedule),
    "blocks": (
        "every block handed out, hit and given back (and the free queue's count)",
        _blocks_and_queue,
    ),
    "cache_hits": ("every prefix-cache hit", _cache_hits),
    "tier": ("every block saved to the host tier, dropped from it and loaded back", _tier),
}
VERIFICATIONS = "every verification (its proposals, how many accepted)"


def described(aspect: str) -> str:
    """What `aspect` compares, in words ("text": lesson 10's, compared with the completions)."""
    if aspect == "text":
        return "every completion's text"
    return VERIFICATIONS if aspect == "verifications" else ASPECTS[aspect][0]


def first_difference(
    aspect: str, stock: list, yours: list, requests: Collection[str] | None = None
) -> str | None:
    """Where the runs whose events are `stock` and `yours` first differ in `aspect`, and how,
    in words: a headline and a line per difference (None: they agree throughout).
    `requests`: compare only these requests' verifications (all when None)."""
    if aspect == "verifications":
        return _first_verification_difference(stock, yours, requests)
    differ = ASPECTS[aspect][1]
    a_steps, b_steps = steps_of(stock), steps_of(yours)
    for a, b in zip(a_steps, b_steps):
        lines = differ(a, b)
        if lines:
            return _said(f"at step {a.number}", lines)
    if len(a_steps) != len(b_steps):
        return (
            f"after step {min(len(a_steps), len(b_steps))}: the stock engine ran "
            f"{len(a_steps)} steps, yours {len(b_steps)}"
        )
    return None


def _said(where: str, lines: list[str]) -> str:
    shown = lines[:MAX_LINES]
    if len(lines) > MAX_LINES:
        shown.append(f"... and {len(lines) - MAX_LINES} more")
    return where + ":\n" + "\n".join(f"  {line}" for line in shown)


def _verifications(events: list, requests: Collection[str] | None) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in events:
        if type(e).__name__ == "SpecTokensVerified":
            if requests is None or e.request_id in requests:
                out.setdefault(e.request_id, []).append(e)
    return out


def _first_verification_difference(
    stock: list, yours: list, requests: Collection[str] | None
) -> str | None:
    """Each request's verifications in order (their steps may shift with the others' work)."""
    a_all, b_all = _verifications(stock, requests), _verifications(yours, requests)
    found = []
    for rid in dict.fromkeys([*a_all, *b_all]):
        a_list, b_list = a_all.get(rid, []), b_all.get(rid, [])
        for i in range(max(len(a_list), len(b_list))):
            a = a_list[i] if i < len(a_list) else None
            b = b_list[i] if i < len(b_list) else None
            if (
                a is not None
                and b is not None
                and (a.proposed, a.num_accepted)
                == (
                    b.proposed,
                    b.num_accepted,
                )
            ):
                continue
            step = (b or a).step
            found.append((step, rid, i, a, b))
            break
    if not found:
        return None
    step, rid, i, a, b = min(found, key=lambda f: f[0])

    def said(e, who: str) -> str:
        if e is None:
            return f"{who} had no verification {i + 1}"
        return f"{who} proposed {list(e.proposed)} and accepted {e.num_accepted}"

    return _said(
        f"at step {step}, {rid}'s verification {i + 1}",
        [said(a, "the stock engine"), said(b, "yours")],
    )


# --- what every run must keep, whoever decided -------------------------------------------------


INVARIANTS = "the engine's invariants (no step of 0 tokens, blocks conserved)"


def broken_invariant(events: list) -> str | None:
    """The first place where a run's events break what every engine run keeps, in words (None:
    none broken):

    - no step gives a request 0 tokens (an entry of 0 is a request that did not run);
    - blocks are conserved: a request gives back only blocks it holds, a fresh block is handed
      to one request only, and after every step the blocks some request holds plus the free
      queue's count are all the cache's blocks (`EngineStarted.num_kv_blocks`); once every
      request has finished, no request holds a block.
    """
    held: dict[str, list[int]] = {}  # request id -> its blocks (a shared one in several lists)
    total: int | None = None
    step = 1
    for e in events:
        name = type(e).__name__
        if name == "EngineStarted":
            total = e.num_kv_blocks
        elif name == "RequestScheduled" and e.num_tokens <= 0:
            return f"at step {e.step}: {e.request_id} was scheduled with {_tokens(e.num_tokens)}"
        elif name == "BlockAllocated":
            owners = [rid for rid, blocks in held.items() if e.block_id in blocks]
            if e.from_free_queue and owners:
                return (
                    f"at step {step}: block {e.block_id} was handed to {e.request_id} from the "
                    f"free queue while {owners[0]} held it"
                )
            held.setdefault(e.request_id, []).append(e.block_id)
        elif name == "CacheHit":
            held.setdefault(e.request_id, []).append(e.block_id)
        elif name == "BlockFreed":
            blocks = held.get(e.request_id, [])
            if e.block_id not in blocks:
                return f"at step {step}: {e.request_id} gave back block {e.block_id}, not its own"
            blocks.remove(e.block_id)
        elif name == "StepSummary":
            zero = [rid for rid, n in e.scheduled.items() if n <= 0]
            if zero:
                return f"at step {e.step}: {zero[0]} was scheduled with {_tokens(e.scheduled[zero[0]])}"
            in_use = {block for blocks in held.values() for block in blocks}
            if total is not None and len(in_use) + e.num_free_blocks != total:
                return (
                    f"after step {e.step}: {_count(len(in_use), 'block')} held and "
                    f"{e.num_free_blocks} free make {len(in_use) + e.num_free_blocks}, but the "
                    f"cache has {total}: blocks were lost or made up"
                )
            step = e.step + 1
    left = {rid: blocks for rid, blocks in held.items() if blocks}
    if left and any(type(e).__name__ == "StepSummary" for e in events):
        rid, blocks = next(iter(left.items()))
        return f"after the run: {rid} still holds {_blocks(blocks)}, though every request finished"
    return None


def first_listed_difference(stock: list[str], yours: list[str], where: str) -> str | None:
    """The first of two lists of outcomes (in words) where they differ (None: they agree)."""
    for a, b in zip(stock, yours):
        if a != b:
            return _said(where, [f"the stock engine: {a}", f"yours: {b}"])
    if len(stock) != len(yours):
        return _said(where, [f"the stock engine: {'; '.join(stock)}", f"yours: {'; '.join(yours)}"])
    return None
