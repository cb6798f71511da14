"""Scripts of operations on the block allocator, and the driver that replays them (lesson 12).

Lesson 12's properties receive a system under test (the engine's, or one with a planted bug) and
a *script*: a list of operations that hypothesis generated to be legal for a correct system. The
property replays the script and checks invariants along the way. Generating only legal scripts
(appending only blocks that are out of the queue, freeing only live requests ...) keeps every
failure meaningful: it is the system that misbehaved, not the script.

Free block queue script: a list of `(op, block_id)`:
    ("popleft", -1)     take the head (the queue is not empty)
    ("append", b)       return block b (it is out of the queue)
    ("remove", b)       pull block b out of the middle (it is in the queue)

Allocator script (an `AllocatorCase`): a pool of `num_blocks` blocks of `block_size`, and a list of
    ("allocate", request_id, n)   make room for n more tokens of the request (admitting it if it
                                  is not live: a new request, or one freed earlier coming back,
                                  as a preempted request does)
    ("free", request_id)          free a live request's blocks (skipped if it is not live)
An allocation may fail (not enough free blocks): then it must change nothing, and a request that
was never admitted is not live.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AllocatorCase:
    num_blocks: int
    block_size: int
    script: tuple[tuple, ...]


@dataclass
class Snapshot:
    """The allocator's state after one operation of a script, as `run_allocator_script` sees it."""

    op: tuple  # the operation just done
    ok: bool  # False for an allocation that failed (returned None)
    tables: dict[str, list[int]] = field(default_factory=dict)  # live request -> block table
    tokens: dict[str, int] = field(default_factory=dict)  # live request -> tokens allocated for


def run_allocator_script(manager, script) -> Iterator[Snapshot]:
    """Replay `script` on a `KVCacheManager`-like `manager`, yielding a Snapshot after each
    operation. (Written for you: lesson 12 is about what to check, not how to drive.)"""
    from nanovllm.request import Request
    from nanovllm.sampling_params import SamplingParams

    live: dict[str, Request] = {}
    arrivals = 0
    for op in script:
        ok = True
        if op[0] == "allocate":
            _, rid, n = op
            if rid not in live:
                arrivals += 1
                live[rid] = Request(rid, [], SamplingParams(), arrival_index=arrivals)
            request = live[rid]
            request.all_token_ids.extend([0] * n)  # the tokens themselves do not matter here
            ok = manager.allocate_slots(request, n) is not None
            if ok:
                request.num_computed_tokens += n
            else:
                del request.all_token_ids[-n:]
                if request.num_computed_tokens == 0:
                    del live[rid]  # never admitted
        elif op[0] == "free":
            if op[1] not in live:
                continue  # nothing to free: not an operation at all
            manager.free(live.pop(op[1]))
        else:
            raise ValueError(f"unknown operation {op!r}")
        yield Snapshot(
            op,
            ok,
            {rid: manager.get_block_table(rid) for rid in live},
            {rid: r.num_computed_tokens for rid, r in live.items()},
        )
