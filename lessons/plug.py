"""The learner's code as parts of the real engine, one part at a time.

`nanovllm lesson N --run` builds an ordinary `LLMEngine` from its parts (`EngineParts`,
`nanovllm/engine/parts.py`), giving the learner's code from lesson N as one of them:
`run.plug_in(impl)` returns the parts, and the engine is built with them. Nothing is assigned
into a built engine and no module's globals change: each adapter here builds a part from the
learner's functions and checks each of its answers before the engine acts on it. Nothing
is read out of a built engine but its public surface either: a part that a lesson asks about
afterwards (how many layers attend with yours, the queue or the tier it built) is a `KeptPart`,
which keeps what it built, found through the engine's `config.parts`.

    free block queue       free_block_queue: your FreeBlockQueue, its walks bounded        03
                           (`BoundedFreeBlockQueue`)
    blocks, slots          kv_cache_manager_cls: `BlocksNeeded` (your blocks_needed),      02
                           step_inputs: `your_slot_mapping` around the engine's
    flat step inputs       step_inputs: `your_step_inputs` (laid out by the engine's    09
                           `step_metadata`)
    scheduler step         scheduler_cls: `YourScheduler` (your schedule_step)       06, 07, 09
    prefix-cache lookup    kv_cache_manager_cls: `YourPrefixCache`                          08
    attention              attention_cls: `PerSequenceAttention` of your functions   01, 04, 05
                           (`your_attention`)
    sampling, detokenizing sampler: `Sampler` with your filters; detokenizer:               10
                           `YourDetokenizer`
    verifying proposals    sampler: `YourVerification`, your verification rules             13
    the host tier          host_tier_cls: `CheckedHostTier` around your HostBlockTier       15
    the sliding window     sliding_window_manager: your SlidingWindowManager class itself   16
                           (`run.py` compares every block it frees and hits with the
                           stock engine's)
    router and dispatch    model_layers: `YourMoeLayers` (`plug_moe.py`), whose mixtures   17
                           of experts route and run with your functions

Lesson 14 cuts the weights as every rank's model is built, in every rank's process:
`plug_tensor_parallel.py` does that one.

A scheduler step written for a lesson works on `sim.Req` views of the engine's requests;
`YourScheduler` builds those views, calls the learner's function, checks the decisions (a
request lost, a request given more tokens than it has left, a step that needs more blocks than
the cache has: `LessonRunError`, named), and carries them out with the scheduler's own
steps (admitting, preempting, `Scheduler.add_to_step`, which also emit the events the
visualizer shows), inside the scheduler's frame of a step (its KV source's part included).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from nanovllm.core.block_hash import short
from nanovllm.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from nanovllm.core.kv_source import ComputedPrefix
from nanovllm.core.scheduler import Scheduler, SchedulerOutput
from nanovllm.engine.detokenizer import IncrementalDetokenizer
from nanovllm.executor.sampler import Sampler
from nanovllm.executor.step_inputs import step_inputs, step_metadata
from nanovllm.lessons.sim import Req, ScheduledSeq, StepPlan
from nanovllm.models.attention import AttentionMetadata
from nanovllm.request import Request, RequestStatus


class LessonRunError(RuntimeError):
    """The learner's component did something the engine cannot carry out (the message says
    what, with the request and the step)."""


class KeptPart:
    """A part that keeps what it builds (`built`, in the order built): given in `EngineParts`
    as `KeptPart(build)`, it is how a lesson asks a built engine about its part afterwards
    (`built_part`), through the engine's `config.parts`, without reaching into the engine."""

    def __init__(self, build: Callable[..., Any]) -> None:
        self.build = build
        self.built: list[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        part = self.build(*args, **kwargs)
        self.built.append(part)
        return part


def built_part(engine, name: str) -> list[Any]:
    """What the engine's part `name` (an `EngineParts` field given as a `KeptPart`) built;
    LessonRunError if the engine was built without such a part, or it built nothing."""
    part = getattr(engine.config.parts, name, None)
    if not isinstance(part, KeptPart) or not part.built:
        raise LessonRunError(f"the engine was built without the lesson's part `{name}`")
    return part.built


# --- the free block queue (lesson 03) ---------------------------------------------------------


def your_free_block_queue(queue_class: type) -> KeptPart:
    """Lesson 03's part `free_block_queue`: the KV cache manager's queue over its blocks is
    `queue_class(blocks)`, built as the engine is (every block free, in id order), and the
    engine gets it as a `BoundedFreeBlockQueue`: the learner's operations, and walks of the
    list that cannot go on for ever. (Kept: `misuse_free_block_queue` is handed it after the
    run; the stock engine's is `KeptPart(FreeBlockQueue)`.)"""
    return KeptPart(functools.partial(BoundedFreeBlockQueue.around, queue_class))


class BoundedFreeBlockQueue:
    """A learner's free block queue as the engine uses it: `popleft`, `append`, `remove` and
    `num_free_blocks` are the learner's; the walks of the list (`get_all_free_blocks`, and
    `peek`, which the engine's step summary calls) first follow its links from the sentinels its
    constructor linked the first and last block to, reading at most one link per block
    (`testing.walk_free_list`): a cycle or a list longer than the blocks is a LessonRunError
    that names the block, not a walk without end. Only then is the learner's
    `get_all_free_blocks` called, and it must list the blocks the links do."""

    def __init__(self, queue: Any, blocks: list) -> None:
        if not blocks:
            raise LessonRunError("the engine's KV cache has no blocks")
        self.queue = queue
        self.head, self.tail = blocks[0].prev_free, blocks[-1].next_free
        if self.head is None or self.tail is None:
            raise LessonRunError(
                "your FreeBlockQueue(blocks) did not link its first block to a head sentinel "
                "and its last to a tail sentinel"
            )
        self.num_blocks = len(blocks)
        self.popleft, self.append, self.remove = queue.popleft, queue.append, queue.remove

    @classmethod
    def around(cls, queue_class: type, blocks: list) -> BoundedFreeBlockQueue:
        """`queue_class(blocks)`, bounded."""
        return cls(queue_class(blocks), blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.queue.num_free_blocks

    def get_all_free_blocks(self) -> list:
        from nanovllm.lessons.testing import walk_free_list

        try:
            linked = walk_free_list(self.head, self.tail, self.num_blocks)
        except AssertionError as exc:
            raise LessonRunError(str(exc)) from None
        listed = list(self.queue.get_all_free_blocks())
        if listed != linked:
            ids = [getattr(block, "block_id", block) for block in listed]
            raise LessonRunError(
                f"your get_all_free_blocks lists {ids[:8]}{'...' if len(ids) > 8 else ''} "
                f"({len(ids)} blocks), but the list's links go through "
                f"{[block.block_id for block in linked[:8]]}{'...' if len(linked) > 8 else ''} "
                f"({len(linked)} blocks)"
            )
        return linked

    def peek(self, n: int) -> list[int]:
        return [block.block_id for block in self.get_all_free_blocks()[:n]]


def misuse_free_block_queue(queue: Any) -> list[str]:
    """What an engine's free block queue does with the two calls a buggy engine could make,
    tried once every request has finished (every block free): freeing a block that is already
    free (a double free), then taking out a block that is not in the queue. The engine itself
    never makes them; the stock queue refuses both with a ValueError and stays as it was, and
    so must yours, or one bug elsewhere would corrupt the list. Returns what happened, in
    words, with the queue's count and list after each call; the second is not tried once the
    first has corrupted the queue."""

    def listed() -> list | str:
        try:
            return queue.get_all_free_blocks()
        except LessonRunError as exc:
            return str(exc)

    def after() -> str:
        blocks = listed()
        if isinstance(blocks, str):
            return f"it counts {queue.num_free_blocks} free blocks, and {blocks}"
        return f"it counts {queue.num_free_blocks} free blocks and lists {len(blocks)}"

    def attempt(words: str, call: Callable[[], Any]) -> bool:
        """Whether `call` was refused with a ValueError; what happened goes in `outcomes`."""
        try:
            call()
        except ValueError:
            outcomes.append(f"{words}: refused with a ValueError; then {after()}")
            return True
        except Exception as exc:  # noqa: BLE001 - the learner's code can fail in any way
            outcomes.append(f"{words}: {type(exc).__name__}, not a ValueError; then {after()}")
            return False
        outcomes.append(f"{words}: done, not refused; then {after()}")
        return False

    outcomes: list[str] = []
    blocks = listed()
    if isinstance(blocks, str) or not blocks:
        return [f"after the run, {after()}"]
    last = blocks[-1]
    if attempt(f"freeing block {last.block_id} again (a double free)", lambda: queue.append(last)):
        taken = queue.popleft()
        words = f"taking out block {taken.block_id}, which was just handed out"
        if attempt(words, lambda: queue.remove(taken)):
            queue.append(taken)
    return outcomes


# --- the model runner's inputs (lessons 02 and 09) ---------------------------------------------


class BlocksNeeded(KVCacheManager):
    """Lesson 02's part `kv_cache_manager_cls`: every request is given `impl.blocks_needed`
    blocks for its tokens (`functools.partial(BlocksNeeded, impl=impl)`).

    The KV cache manager takes ceil((tokens + lookahead) / block_size) blocks for a request's
    tokens and the lookahead slots reserved after them (`allocate_slots`). Asked to reserve
    `yours * block_size - tokens` slots more than it was (fewer, when that is negative), it
    takes exactly `yours = blocks_needed(tokens)` blocks: a count one too high shows as a
    block handed out that the stock engine does not hand out, one too low as a slot with no
    block.
    """

    def __init__(self, *args: Any, impl: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.impl = impl

    def allocate_slots(
        self, request, num_new_tokens, new_computed_blocks=None, num_lookahead_tokens=0
    ):
        hits = len(new_computed_blocks.blocks[0]) if new_computed_blocks else 0
        computed = request.num_computed_tokens + hits * self.block_size
        tokens = computed + num_new_tokens + num_lookahead_tokens
        yours = self.impl.blocks_needed(tokens, self.block_size)
        if not isinstance(yours, int) or yours < 0:
            raise LessonRunError(
                f"blocks_needed({tokens}, {self.block_size}) returned {yours!r}, not a count of "
                "blocks"
            )
        extra = yours * self.block_size - tokens
        return super().allocate_slots(
            request, num_new_tokens, new_computed_blocks, num_lookahead_tokens + extra
        )


def your_slot_mapping(impl) -> Callable[[SchedulerOutput, int], Any]:
    """Lesson 02's part `step_inputs`: the engine's step inputs, with every block table cut to
    `impl.blocks_needed` of its tokens and the slot mapping `impl.slot_mapping` of each
    request's new positions (`impl.slot_for` of a decode's one position)."""

    def build(out: SchedulerOutput, block_size: int):
        scheduled = []
        for s in out.scheduled:
            end = s.num_computed_tokens + s.num_new_tokens
            table = s.block_table[: impl.blocks_needed(end, block_size)]
            scheduled.append(replace(s, block_tables=(table, *s.block_tables[1:])))
        input_ids, positions, meta, logits_rows = step_inputs(
            replace(out, scheduled=scheduled), block_size
        )
        slots = []
        for s in scheduled:
            start = s.num_computed_tokens
            table = list(s.block_table)  # (the lesson's functions take lists)
            if s.num_new_tokens == 1:  # a decode: one token, one slot
                new = [impl.slot_for(table, start, block_size)]
            else:
                new = impl.slot_mapping(table, start, start + s.num_new_tokens, block_size)
            slots.extend(int(slot) for slot in new)
        slot_mapping = torch.tensor(slots, dtype=torch.int64)
        return input_ids, positions, replace(meta, slot_mapping=slot_mapping), logits_rows

    return build


def your_step_inputs(impl) -> Callable[[SchedulerOutput, int], Any]:
    """Lesson 09's part `step_inputs`: the step's flat inputs (token ids, positions, slots,
    query starts, context lengths, logits rows) are all `impl.prepare_inputs`'s; the engine's
    `step_metadata` lays them out for attention, and the slot mapping is then the learner's."""

    def build(out: SchedulerOutput, block_size: int):
        batch = [
            ScheduledSeq(
                list(s.request.all_token_ids),
                s.num_computed_tokens,
                s.num_new_tokens,
                list(s.block_table),
            )
            for s in out.scheduled
        ]
        inputs = impl.prepare_inputs(batch, block_size)
        query_start_loc, seq_lens = list(inputs.query_start_loc), list(inputs.seq_lens)
        if len(query_start_loc) != len(seq_lens) + 1 or len(seq_lens) != len(batch):
            raise LessonRunError(
                f"query_start_loc has {len(query_start_loc)} entries and seq_lens "
                f"{len(seq_lens)} for a step of {len(batch)} requests"
            )
        if query_start_loc[0] != 0:
            raise LessonRunError(
                f"query_start_loc starts at {query_start_loc[0]}: the first request's rows "
                "start at row 0"
            )
        query_lens = [int(b - a) for a, b in zip(query_start_loc, query_start_loc[1:])]
        positions, meta = step_metadata(
            list(inputs.positions),
            query_lens,
            seq_lens,
            [s.block_table for s in out.scheduled],
            block_size,
        )
        slot_mapping = torch.tensor(list(inputs.slot_mapping), dtype=torch.int64)
        input_ids = torch.tensor(list(inputs.input_ids), dtype=torch.int64)
        logits_rows = [int(r) for r in inputs.logits_rows]
        return input_ids, positions, replace(meta, slot_mapping=slot_mapping), logits_rows

    return build


# --- the scheduler step (lessons 06, 07 and 09) --------------------------------------------------


@dataclass(frozen=True)
class StepLimits:
    """What a lesson's scheduler step is given besides the queues: the scheduler's limits and
    the KV cache's size."""

    max_num_seqs: int
    token_budget: int  # max_num_batched_tokens
    num_blocks: int
    block_size: int


class YourScheduler(Scheduler):
    """Lessons 06, 07 and 09's part `scheduler_cls`: the engine's `Scheduler`, with every
    decision of `schedule` made by a lesson's `schedule_step`
    (`functools.partial(YourScheduler, schedule_step=call)`).

    `call(running, waiting, limits)` runs the learner's function on the `Req` views and the
    step's `StepLimits` (the lessons' signatures differ: lesson 07's takes the cache's size)
    and returns its plan. The
    views come in the learner's own order, as its function left its lists the step before
    (new requests at the back of `waiting`): a learner who puts a victim at the back of the
    queue sees it there. The scheduler's queues and every request's status stay the
    scheduler's: the plan is carried out with its own steps (`admit`, `preempt_running`,
    `add_to_step`), inside its own frame of a step (`begin_step`, `end_step`).
    """

    def __init__(
        self,
        *args: Any,
        schedule_step: Callable[[list[Req], list[Req], StepLimits], Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.schedule_step = schedule_step
        # The learner's queues as its function left them (request ids, in its order).
        self.your_running: list[str] = []
        self.your_waiting: list[str] = []

    def schedule(self) -> SchedulerOutput:
        out = self.begin_step()
        where = f"step {self.step_count}"
        live_waiting = [r for r in self.waiting if r.status != RequestStatus.FINISHED]
        running_reqs = _in_order(self.running, self.your_running)
        waiting_reqs = _in_order(live_waiting, self.your_waiting)
        engine_of = {r.request_id: r for r in running_reqs + waiting_reqs}
        to_verify = {r.request_id: self.extra_tokens.tokens_after(r) for r in running_reqs}
        running = [_view(r, to_verify[r.request_id]) for r in running_reqs]
        waiting = [_view(r, []) for r in waiting_reqs]
        limits = StepLimits(
            self.max_num_seqs, self.max_num_batched_tokens, self.kv.num_blocks, self.kv.block_size
        )
        plan = self.schedule_step(running, waiting, limits)
        if isinstance(plan, StepPlan):
            scheduled, preempted = dict(plan.scheduled), list(plan.preempted)
        else:
            scheduled, preempted = dict(plan), []

        if sorted(r.id for r in running + waiting) != sorted(engine_of):
            raise LessonRunError(f"{where}: requests were lost or duplicated between the queues")
        for rid in preempted:
            request = engine_of.get(rid)
            if request is None or request.status != RequestStatus.RUNNING:
                raise LessonRunError(f"{where}: {rid} was preempted but was not running")
            self.preempt_running(request)
            out.preempted.append(request)
        for r in waiting:  # a running request holds its blocks until it is preempted
            if engine_of[r.id].status == RequestStatus.RUNNING:
                raise LessonRunError(
                    f"{where}: {r.id} went back to the waiting queue but was not preempted"
                )
        for r in running:  # admitted this step: the scheduler moves them to its running queue
            if engine_of[r.id].status != RequestStatus.RUNNING:
                self.admit(engine_of[r.id], ComputedPrefix(self.kv_source))  # (no KV yet)
        self.your_running = [r.id for r in running]
        self.your_waiting = [r.id for r in waiting]

        for rid, n in scheduled.items():
            request = engine_of.get(rid)
            if request is None or rid not in self.your_running:
                raise LessonRunError(f"{where}: {rid} was scheduled but is not running")
            guesses = to_verify.get(rid, [])
            left = request.num_tokens + len(guesses) - request.num_computed_tokens
            if not 1 <= n <= left:
                raise LessonRunError(
                    f"{where}: {rid} was given {n} tokens; it has {left} left to compute"
                )
            if self.kv.allocate_slots(request, n) is None:
                raise LessonRunError(
                    f"{where}: no free KV block for {rid}'s {n} tokens: the step needs more "
                    f"blocks than the cache's {self.kv.num_blocks}"
                )
            self.add_to_step(out, request, n, guesses)
        return self.end_step(out)


def _in_order(requests: list[Request], order: list[str]) -> list[Request]:
    """`requests` in `order` (request ids); those not in it after, in their own order."""
    rank = {rid: i for i, rid in enumerate(order)}
    return sorted(requests, key=lambda r: rank.get(r.request_id, len(rank)))


def _view(request, to_verify: list[int]) -> Req:
    """The scheduler's view of an engine request (see `sim.Req`): its proposed tokens
    (`to_verify`), if any, are tokens to compute as its own are."""
    return Req(
        request.request_id,
        request.num_prompt_tokens,
        max_output=request.max_tokens,
        num_output=request.num_output_tokens,
        num_computed=request.num_computed_tokens,
        num_proposed=len(to_verify),
    )


def your_scheduler(
    call: Callable[[list[Req], list[Req], StepLimits], Any],
) -> Callable[..., Scheduler]:
    """The part `scheduler_cls` whose every decision is `call`'s (see `YourScheduler`)."""
    return functools.partial(YourScheduler, schedule_step=call)


# --- the prefix cache (lesson 08) ----------------------------------------------------------------


class YourPrefixCache(KVCacheManager):
    """Lesson 08's part `kv_cache_manager_cls`: every block hash is yours, and every lookup at
    admission is `impl.cached_prefix` over the cache's {hash: block id} table
    (`functools.partial(YourPrefixCache, impl=impl)`).

    As in the engine (`extend_block_hashes`), a request's full blocks are hashed once each, as
    its tokens arrive, with `impl.hash_block_tokens` chained to the block before; at admission
    `impl.block_hashes` of its tokens must give the same list (LessonRunError otherwise). The
    manager registers full blocks under the hashes it finds in its per-request list and only
    computes those missing, so filling that list with the learner's hashes first makes the
    registry theirs too.
    """

    def __init__(self, *args: Any, impl: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.impl = impl

    def fill_hashes(self, request) -> list:
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        tokens, block_size = list(request.all_token_ids), self.block_size
        for i in range(len(hashes), len(tokens) // block_size):
            parent = hashes[i - 1] if i > 0 else None
            block = tokens[i * block_size : (i + 1) * block_size]
            hashes.append(self.impl.hash_block_tokens(parent, block))
        return hashes

    def get_computed_blocks(self, request):
        hashes, block_size = self.fill_hashes(request), self.block_size
        listed = list(self.impl.block_hashes(list(request.all_token_ids), block_size))
        if listed != hashes:
            i = next((i for i, pair in enumerate(zip(listed, hashes)) if pair[0] != pair[1]), None)
            where = (
                f"first at block {i}"
                if i is not None
                else f"{len(listed)} hashes, not {len(hashes)}"
            )
            raise LessonRunError(
                f"block_hashes of {request.request_id}'s {len(request.all_token_ids)} tokens "
                f"differs from hash_block_tokens chained block by block: {where}"
            )
        table = {h: block.block_id for h, block in self.cached_block_hash_to_block.items()}
        ids = list(self.impl.cached_prefix(list(request.all_token_ids), block_size, table))
        blocks = [self.blocks[i] for i in ids]
        for i, block in enumerate(blocks):
            tokens = tuple(request.all_token_ids[i * block_size : (i + 1) * block_size])
            if block.token_ids != tokens:
                raise LessonRunError(
                    f"cached_prefix gave {request.request_id} block {block.block_id} as its "
                    f"block {i}, but that block holds other tokens"
                )
        return KVCacheBlocks((blocks,)), len(blocks) * block_size

    def allocate_slots(
        self, request, num_new_tokens, new_computed_blocks=None, num_lookahead_tokens=0
    ):
        self.fill_hashes(request)
        return super().allocate_slots(
            request, num_new_tokens, new_computed_blocks, num_lookahead_tokens
        )


# --- attention (lessons 01, 04 and 05) -----------------------------------------------------------


class PerSequenceAttention:
    """The engine's attention interface, `forward(q, k, v, key_cache, value_cache, meta)`,
    computed one sequence at a time by a lesson's functions:

    store(k, v, key_cache, value_cache, slot_mapping)        writes the step's new K/V
    gather(key_cache, value_cache, block_table, seq_len)     a sequence's context K/V
    attend(q, ctx_k, ctx_v)                                  causal, queries last in the context
    decode(q, key_cache, value_cache, block_table, seq_len)  one query token (None: `attend`)

    Slower than the engine's batched paths (a Python loop over sequences); the same computation,
    up to float rounding.
    """

    def __init__(self, store, gather, attend, decode=None) -> None:
        self.store, self.gather, self.attend, self.decode = store, gather, attend, decode

    def forward(self, q, k, v, key_cache, value_cache, meta: AttentionMetadata) -> torch.Tensor:
        self.store(k, v, key_cache, value_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        for i in range(meta.num_seqs):
            start, q_len = meta.query_start_list[i], meta.query_lens_list[i]
            seq_len, table = meta.seq_lens_list[i], meta.block_tables[i]
            rows = slice(start, start + q_len)
            if q_len == 1 and self.decode is not None:
                out[rows] = self.decode(q[rows], key_cache, value_cache, table, seq_len)
            else:
                ctx_k, ctx_v = self.gather(key_cache, value_cache, table, seq_len)
                out[rows] = self.attend(q[rows], ctx_k, ctx_v)
        return out


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Plain causal attention with GQA, the queries being the last q_len of kv_len positions:
    what a lesson's attention does not cover is done this way."""
    q_len, kv_len = q.shape[0], k.shape[0]
    q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
    mask = torch.arange(kv_len, device=q.device)[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.transpose(0, 1)


def your_attention(make: Callable[..., PerSequenceAttention]) -> KeptPart:
    """The part `attention_cls` of lessons 01, 04 and 05: `make(heads, kv heads, head_dim,
    scale)` builds each layer's `PerSequenceAttention`, and the part keeps them
    (`count_your_attention`)."""
    return KeptPart(make)


def count_your_attention(engine) -> int:
    """How many of the built engine's layers attend with a `PerSequenceAttention`: what its
    part `attention_cls` (`your_attention`) built, one per layer; LessonRunError if not all of
    them do."""
    built = built_part(engine, "attention_cls")
    num_layers = engine.model_args.num_hidden_layers
    yours = sum(isinstance(attention, PerSequenceAttention) for attention in built)
    if yours != num_layers:
        raise LessonRunError(
            f"only {yours} of the engine's {num_layers} layers have your attention"
        )
    return yours


# --- sampling and detokenizing (lesson 10) -------------------------------------------------------


def your_filters(apply_top_k, apply_top_p):
    """The sampler's filters (`Sampler.filters`: per-row top-k, top-p and min-p over a batch)
    made of the learner's one-row functions. Lesson 10 has no min-p."""

    def filters(logits, top_k, top_p, min_p) -> torch.Tensor:
        if bool((min_p > 0).any()):
            raise LessonRunError("min_p is not part of lesson 10's sampler")
        vocab = logits.shape[-1]
        rows = []
        for i in range(logits.shape[0]):
            row = logits[i : i + 1]  # [1, vocab]
            if int(top_k[i]) < vocab:
                row = apply_top_k(row, int(top_k[i]))
            if float(top_p[i]) < 1:
                row = apply_top_p(row, float(top_p[i]))
            rows.append(row)
        return torch.cat(rows)

    return filters


class YourDetokenizer:
    """The engine's incremental detokenizer, each step by the learner's `detokenize_step`.

    The final flush of a request (an unfinished character when it ends) is the engine's: it is
    not part of the exercise.
    """

    def __init__(self, stock, detokenize_step) -> None:
        self.stock, self.detokenize_step = stock, detokenize_step

    def step(self, state, output_ids: list[int], final: bool = False) -> str:
        if final:
            return self.stock.step(state, output_ids, final=True)
        tokenizer = _Decoding(self.stock.tokenizer, state.skip_special_tokens)
        return self.detokenize_step(tokenizer, state, output_ids)


class _Decoding:
    """A tokenizer whose `decode` keeps the request's skip_special_tokens choice."""

    def __init__(self, tokenizer, skip_special_tokens: bool) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens

    def decode(self, token_ids, **_: Any) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=self.skip)


def your_sampling(impl) -> dict[str, Callable]:
    """Lesson 10's parts: `sampler`, the engine's with your filters, and `detokenizer`, the
    engine's with every step's text by your `detokenize_step`."""

    def detokenizer(tokenizer) -> YourDetokenizer:
        return YourDetokenizer(IncrementalDetokenizer(tokenizer), impl.detokenize_step)

    filters = your_filters(impl.apply_top_k, impl.apply_top_p)
    return dict(sampler=functools.partial(Sampler, filters=filters), detokenizer=detokenizer)


# --- verifying proposed tokens (lesson 13) -------------------------------------------------------


class YourVerification(Sampler):
    """Lesson 13's part `sampler`: the engine's sampler, with every proposal verified by the
    learner's `verify_greedy` and `verify_random` (`your_verification(impl)`): it is its own
    `verifier` (its `greedy` and `random` below call them). Each result is checked before the engine sees it: a list
    of 1 to s + 1 vocabulary ids, the proposals it was given unchanged (the engine reads them
    again afterwards), and for `verify_random` the probabilities too (`LessonRunError`
    otherwise, naming the proposals and what came back).

    The engine's proposers are certain (the n-gram lookup, a draft model's greedy tokens), so
    it passes no `draft_probs`; your `verify_random` is given them spelled out, 1 at each
    proposal, which the rule treats exactly alike. Your draws are not the engine's, so a
    sampled request's tokens cannot be compared one for one: instead every sampled
    verification is checked against what the rule can emit (`_rule_broken`).
    """

    def __init__(self, *args: Any, verify_greedy, verify_random, **kwargs: Any) -> None:
        super().__init__(*args, verifier=self, **kwargs)  # its `greedy` and `random` below
        self.yours = verify_greedy, verify_random
        self.vocab = 0  # the vocabulary's size, from the logits of the call under way

    def __call__(self, logits: torch.Tensor, requests, to_verify=None):
        self.vocab = logits.shape[-1]
        return super().__call__(logits, requests, to_verify)

    def greedy(self, target_argmax: list[int], draft_token_ids: list[int]) -> list[int]:
        given = list(draft_token_ids)
        out = self.yours[0](target_argmax, draft_token_ids)
        return _checked("verify_greedy", out, given, draft_token_ids, self.vocab)

    def random(self, target_probs, draft_token_ids, generator, draft_probs=None) -> list[int]:
        given, probs, vocab = list(draft_token_ids), target_probs.clone(), self.vocab
        if draft_probs is None:  # a certain proposer: q is 1 at each proposal, 0 elsewhere
            ids = torch.tensor(given, dtype=torch.int64, device=target_probs.device)
            draft_probs = F.one_hot(ids, vocab).to(target_probs.dtype)  # [s, vocab]
        out = self.yours[1](target_probs, draft_token_ids, generator, draft_probs)
        if not torch.equal(probs, target_probs):
            raise LessonRunError("your verify_random changed the target_probs it was given")
        tokens = _checked("verify_random", out, given, draft_token_ids, vocab)
        broken = _rule_broken(tokens, given, probs)
        if broken is not None:
            raise LessonRunError(
                f"your verify_random emitted {tokens} for the proposals {given}: {broken}"
            )
        return tokens


def _rule_broken(tokens: list[int], proposals: list[int], target_probs: torch.Tensor) -> str | None:
    """What in `tokens`, emitted by rejection sampling for certain `proposals`, no draw of the
    rule could give, in words (None: nothing). The rule emits the accepted proposals, then one
    token: the bonus from the target's row after the last proposal, or, at a rejected
    proposal, a draw from the residual max(0, p - q), which is 0 at that proposal. So every
    token but the last is its proposal, no token has probability 0 in its row of the target,
    and a step that stops early does not end with the very proposal it rejected."""
    last = len(tokens) - 1
    for i, (token, proposal) in enumerate(zip(tokens[:last], proposals)):
        if token != proposal:
            return (
                f"its token {i + 1} is {token}, but every token before the last is an accepted "
                f"proposal, and proposal {i + 1} is {proposal}"
            )
    token = tokens[last]
    if float(target_probs[last][token]) == 0.0:
        where = "the bonus" if last == len(proposals) else f"at proposal {last + 1}'s place"
        return (
            f"its last token, {token} ({where}), has probability 0 in row {last} of "
            "target_probs, the target's distribution at that place"
        )
    if last < len(proposals) and token == proposals[last]:
        return (
            f"it stopped at proposal {last + 1} ({token}) yet emitted that very token there: "
            "after a rejection the token is drawn from the residual max(0, p - q), which is 0 "
            "at a certain proposal"
        )
    return None


def _checked(name: str, out: Any, given: list[int], after: list[int], vocab: int) -> list[int]:
    """`out` as a list of ints, if it is 1 to s + 1 vocabulary ids and the proposals (`given`,
    `after` the call) are unchanged."""
    if after != given:
        raise LessonRunError(f"your {name} changed the proposals it was given: {given} -> {after}")
    draft_token_ids, s = given, len(given)
    try:
        tokens = [int(t) for t in out]
    except TypeError as exc:
        raise LessonRunError(f"your {name} returned {out!r}, not a list of token ids") from exc
    if not 1 <= len(tokens) <= s + 1:
        raise LessonRunError(
            f"your {name} returned {len(tokens)} tokens for {s} proposals {draft_token_ids}: "
            f"a step emits 1 to {s + 1}"
        )
    if any(not 0 <= t < vocab for t in tokens):
        raise LessonRunError(
            f"your {name} returned {tokens}: not all in the vocabulary (0-{vocab - 1})"
        )
    return tokens


def your_verification(impl) -> Callable[..., Sampler]:
    """The part `sampler` that verifies every proposal with your rules (`YourVerification`)."""
    return functools.partial(
        YourVerification, verify_greedy=impl.verify_greedy, verify_random=impl.verify_random
    )


# --- the host tier (lesson 15) -------------------------------------------------------------------


class CheckedHostTier:
    """Lesson 15's part `host_tier_cls` (`your_host_tier`): a learner's `HostBlockTier` as the
    OffloadingConnector uses it: every call is the
    learner's, and what comes back is checked before the engine acts on it, since a wrong slot
    would not fail: it would copy one block's KV over another's, or load the wrong KV, and show
    only as different tokens later. The check keeps which hash each slot was given (`owner`):

    - `insert` returns None only when every entry is pinned, else (slot, evicted): a slot in
      range that holds no other entry, or the slot of the entry it evicted, which is not pinned
      and is gone from the tier;
    - `num_matched` counts hashes the tier holds (`in`), and `lookup` then gives each the slot
      it was put in (the engine looks up only what `num_matched` counted).

    `LessonRunError` otherwise, naming the hash (its first 12 hex digits) and the slot.
    """

    def __init__(self, yours: type, num_blocks: int) -> None:
        self.yours = yours  # the learner's class
        self.tier = yours(num_blocks)
        self.num_blocks = num_blocks
        self.owner: dict[int, bytes] = {}  # slot -> the hash your insert put there
        self.num_inserts = 0  # (the connector's worker side builds a tier it never fills)

    def __len__(self) -> int:
        return len(self.tier)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.tier

    def lookup(self, block_hash: bytes) -> int | None:
        slot = self.tier.lookup(block_hash)
        if slot is None or self.owner.get(slot) != block_hash:
            where = next((s for s, h in self.owner.items() if h == block_hash), None)
            raise LessonRunError(
                f"your lookup({short(block_hash)}) gave {slot!r}, but your insert put that "
                f"hash in slot {where} (and your num_matched counted it as in the tier)"
            )
        return slot

    def touch(self, block_hash: bytes) -> None:
        self.tier.touch(block_hash)

    def num_matched(self, block_hashes: Sequence[bytes]) -> int:
        n = self.tier.num_matched(block_hashes)
        if not isinstance(n, int) or not 0 <= n <= len(block_hashes):
            raise LessonRunError(
                f"your num_matched of {len(block_hashes)} hashes returned {n!r}, not a count "
                f"from 0 to {len(block_hashes)}"
            )
        missing = next((h for h in block_hashes[:n] if h not in self.tier), None)
        if missing is not None:
            raise LessonRunError(
                f"your num_matched counted the first {n} of {len(block_hashes)} hashes, but "
                f"{short(missing)}, one of them, is not in your tier"
            )
        return n

    def insert(self, block_hash: bytes, pinned=()) -> tuple[int, bytes | None] | None:
        placed = self.tier.insert(block_hash, pinned)
        self.num_inserts += 1
        said = f"your insert({short(block_hash)})"
        if placed is None:
            spare = next((h for h in self.owner.values() if h not in pinned), None)
            if spare is not None and len(self.owner) == self.num_blocks:
                raise LessonRunError(f"{said} returned None, but {short(spare)} is not pinned")
            if len(self.owner) < self.num_blocks:
                raise LessonRunError(f"{said} returned None, but the tier has a free slot")
            return None
        if not (isinstance(placed, tuple) and len(placed) == 2):
            raise LessonRunError(f"{said} returned {placed!r}, not (slot, evicted) or None")
        slot, evicted = placed
        if not isinstance(slot, int) or not 0 <= slot < self.num_blocks:
            raise LessonRunError(
                f"{said} gave slot {slot!r}; the tier's slots are 0 to {self.num_blocks - 1}"
            )
        held = self.owner.get(slot)
        if evicted is None and held is not None:
            raise LessonRunError(
                f"{said} gave slot {slot}, which holds {short(held)}, and evicted nothing: "
                "its KV would be overwritten"
            )
        if evicted is not None:
            if held != evicted or evicted in self.tier:
                raise LessonRunError(
                    f"{said} evicted {short(evicted)} and gave its slot {slot}, but that slot "
                    f"held {short(held) if held else 'nothing'}"
                    + (
                        ", and the evicted hash is still in your tier"
                        if evicted in self.tier
                        else ""
                    )
                )
            if evicted in pinned:
                raise LessonRunError(f"{said} evicted {short(evicted)}, which is pinned")
        self.owner[slot] = block_hash
        return slot, evicted

    def remove(self, block_hash: bytes) -> None:
        self.tier.remove(block_hash)
        self.owner = {s: h for s, h in self.owner.items() if h != block_hash}

    def clear(self) -> None:
        self.tier.clear()
        self.owner.clear()


def your_host_tier(tier_class: type) -> KeptPart:
    """Lesson 15's part `host_tier_cls`: the OffloadingConnector keeps its host tier in
    `tier_class`, checked (`CheckedHostTier`), and the part keeps the tier it built
    (`host_tier_of`). The stock engine's run gives `your_host_tier(HostBlockTier)`: the
    engine's own tier, checked alike."""
    return KeptPart(functools.partial(CheckedHostTier, tier_class))


def forget_the_host_tier(engine) -> list[str]:
    """Lesson 15, once every request is done: the host tier forgets every other entry (in
    the order of their hashes), one at a time (`remove`, what the tier does when a block's KV
    turns out unusable), then takes as many new entries as it has slots: the freed slots
    first, then the slots of the entries it kept, least recently used first. What it holds,
    gives and evicts is listed in words, to compare with the stock engine's; a learner's tier
    is also checked call by call (`CheckedHostTier`)."""
    tier = host_tier_of(engine)
    held = sorted(tier.owner.values())
    removed, kept = held[::2], held[1::2]
    for block_hash in removed:
        tier.remove(block_hash)
    still = sum(block_hash in tier for block_hash in removed)
    gone = sum(block_hash not in tier for block_hash in kept)
    left = len(tier)
    num_slots = tier.num_blocks
    fresh = [bytes([i % 256, i // 256]) * 16 for i in range(num_slots)]  # no block's hash
    placed = [tier.insert(block_hash) for block_hash in fresh]
    into_free = sum(p is not None and p[1] is None for p in placed)
    evicted = [short(p[1]) for p in placed if p is not None and p[1] is not None]
    return [
        f"removing {len(removed)} of its {len(held)} entries one at a time left {left} "
        f"({still} of the removed still in it, {gone} of the others gone)",
        f"then {num_slots} new entries: {into_free} took a free slot, and these were evicted, "
        f"in order: {', '.join(evicted) or 'none'}",
    ]


def host_tier_of(engine) -> CheckedHostTier:
    """The host tier the engine's part `host_tier_cls` (`your_host_tier`) built for its
    OffloadingConnector (LessonRunError if it was built without one). Each side of the
    connector builds one; the scheduler's side is the one that keeps entries (the first tier
    inserted into; the first built while none has been)."""
    tiers = built_part(engine, "host_tier_cls")
    return next((tier for tier in tiers if tier.num_inserts), tiers[0])
