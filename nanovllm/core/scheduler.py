"""Scheduler: every step, decide which requests run and for how many tokens.

This is continuous batching. There is no "batch" that starts and ends together: each step the
scheduler fills a token budget (`max_num_batched_tokens`) and a sequence budget (`max_num_seqs`)

1. first with the *running* requests, in the order they were admitted: one token each for those
   decoding, the next chunk for those still prefilling;
2. then with *waiting* requests, in arrival order, as long as budget and free KV blocks allow.

So a request that finishes frees its place at once and a waiting one joins in the very next step;
prefills and decodes share a step. A prompt longer than the remaining budget is prefilled a chunk
at a time over several steps (chunked prefill).

Everything is phrased with one number per request, `num_computed_tokens`: a request is given
`num_tokens - num_computed_tokens` tokens (capped by the budget). When it has caught up, the step
samples its next token.

When the KV cache cannot hold the next tokens of the running requests, the most recently admitted
running request is *preempted*: its blocks are freed, it goes back to the front of the waiting queue
with `num_computed_tokens = 0`, and later it is recomputed from its prompt plus the tokens it had
already produced. The recomputed KV equals the first up to float rounding (the batch it is computed
in differs), so its greedy output matches in practice what it would have been without preemption.

A KV source (`kv_source.py`: a KV connector) is one more source of computed tokens: at admission,
the blocks after the prefix-cache hit that it can load into the request's new blocks. The two
come as one `ComputedPrefix`, which counts them. A waiting request whose grammar is still
compiling (`WAITING_FOR_FSM`, structured outputs) is passed over until it has compiled.

A running request may also have *extra tokens* (`extra_tokens.py`): tokens after its own that a
part asks to compute in its step (speculative decoding's proposals), and KV slots held past them.
The scheduler computes them as ordinary tokens; the step samples a row for each, and a sampled
row may take back the tokens after it: those are stepped back over in `update_from_output`.

Cost per step: proportional to the requests scheduled (at most `max_num_seqs`), never to the
length of the waiting queue; aborted waiting requests are dropped lazily when they reach its head.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from nanovllm.config import EngineConfig
from nanovllm.core.extra_tokens import ExtraTokens
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.kv_source import ComputedPrefix, KVSource, NoKVSource, find_computed_prefix
from nanovllm.core.scheduler_output import ScheduledRequest, SchedulerOutput
from nanovllm.events import EventBus, RequestFinished, RequestPreempted, RequestScheduled
from nanovllm.request import FinishReason, Request, RequestStatus

# (the step's types live in `scheduler_output.py`)
__all__ = ["ScheduledRequest", "Scheduler", "SchedulerOutput"]


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        kv_cache_manager: KVCacheManager,
        events: EventBus,
        kv_source: KVSource | None = None,
        extra_tokens: ExtraTokens | None = None,
    ):
        self.config = config
        self.kv = kv_cache_manager
        self.events = events
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        # Asked at admission for computed tokens from outside the device pool (`kv_source.py`).
        self.kv_source = kv_source or NoKVSource()
        # Asked for a running request's tokens past its own, and the KV slots held past them.
        self.extra_tokens = extra_tokens or ExtraTokens()
        self.waiting: deque[Request] = deque()
        self.num_waiting = 0  # live requests in `waiting` (aborted ones are dropped lazily)
        self.running: list[Request] = []  # in admission order: the last is preempted first
        self.requests: dict[str, Request] = {}  # every unfinished request by id
        self.step_count = 0
        # Statistics, in tokens and events, for metrics and the benchmark.
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.external_prefix_cache_hits = 0  # tokens from outside the device pool

    # --- queue management ---------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.num_waiting += 1

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def finish_request(self, request: Request, reason: FinishReason) -> None:
        """End `request` in any state: free its blocks at once and drop it from the queues."""
        if request.status == RequestStatus.FINISHED:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)  # O(max_num_seqs), not O(waiting)
        else:
            self.num_waiting -= 1  # left in `waiting`; skipped when it reaches the head
        self.kv_source.request_finished(request, self.kv.block_tables(request.request_id)[0])
        self.kv.free(request)
        request.status, request.finish_reason = RequestStatus.FINISHED, reason
        del self.requests[request.request_id]
        if self.events.active:
            self.events.emit(
                RequestFinished(
                    self.step_count,
                    request.request_id,
                    str(reason),
                    request.num_prompt_tokens,
                    request.num_output_tokens,
                )
            )

    # --- the step ---------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = self.begin_step()
        budget, slots_after = self.max_num_batched_tokens, self.extra_tokens.num_slots_after

        # 1. Running requests, oldest first. Each needs its remaining tokens (1 when decoding,
        # plus any extra tokens).
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            extra = self.extra_tokens.tokens_after(request)
            num_tokens = self.num_tokens(request) + len(extra)
            num_new = min(num_tokens - request.num_computed_tokens, budget)
            # Make room in the KV cache, preempting the newest running request until it fits.
            while self.kv.allocate_slots(request, num_new, None, slots_after) is None:
                victim = self.running.pop()
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                break  # it preempted itself: nobody left to make room
            self.add_to_step(out, request, num_new, extra)
            budget -= num_new
            i += 1

        # 2. Waiting requests, in arrival order. Not when we just preempted: memory is tight.
        # One not ready yet (its grammar compiling: vLLM's WAITING_FOR_FSM) is set aside.
        skipped: list[Request] = []
        while not out.preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self._peek_waiting()
            if request is None:
                break
            if request.status == RequestStatus.WAITING_FOR_FSM:
                skipped.append(self.waiting.popleft())
                continue
            # Its tokens with KV already: the prefix cache's, then its KV source's (`kv_source.py`).
            prefix = find_computed_prefix(self.kv, self.kv_source, request)
            num_new = request.num_tokens - prefix.num_computed
            if num_new > budget and not self.config.enable_chunked_prefill:
                out.waiting_reason = "token_budget"  # unchunked, a prompt must fit the budget
                break
            num_new = min(num_new, budget)
            num_slots = prefix.num_slots(num_new)
            if self.kv.allocate_slots(request, num_slots, prefix.blocks, slots_after) is None:
                # Not enough free blocks: wait for running requests to finish.
                needed = self.kv.get_num_blocks_to_allocate(
                    request, num_slots + slots_after, prefix.blocks
                )
                out.waiting_blocks = (needed, self.kv.num_free_blocks)
                break
            self.admit(request, prefix)
            self.add_to_step(out, request, num_new)
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))
        return self.end_step(out)

    # --- the steps a schedule is made of (a lesson's scheduler makes its own of them) ---------

    def begin_step(self) -> SchedulerOutput:
        """A new, empty step: its number, and the KV cache manager's records of the step before
        cleared."""
        self.step_start = time.perf_counter()
        self.step_count += 1
        self.kv.block_pool.begin_step()
        return SchedulerOutput(step=self.step_count)

    def end_step(self, out: SchedulerOutput) -> SchedulerOutput:
        """The step's tail: the cached blocks it evicted, what its KV source tells the workers,
        and the time scheduling took."""
        out.evicted_blocks = list(self.kv.block_pool.step_evicted_blocks)
        out.kv_connector_metadata = self.kv_source.build_connector_meta(out)
        out.schedule_time = time.perf_counter() - self.step_start
        return out

    def admit(self, request: Request, prefix: ComputedPrefix) -> None:
        """Move the waiting `request`, its blocks allocated, to the end of the running queue,
        with `prefix`'s tokens computed."""
        prefix.allocated(request, self.kv.block_tables(request.request_id)[0])
        if self.waiting[0] is request:  # (always, in `schedule`: O(1))
            self.waiting.popleft()
        else:
            self.waiting.remove(request)
        self.num_waiting -= 1
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = prefix.num_computed
        request.num_cached_tokens = prefix.num_computed
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += prefix.num_cached
        self.external_prefix_cache_hits += prefix.num_external

    def preempt_running(self, request: Request) -> None:
        """Take a running `request` out of the running queue and preempt it (`preempt`)."""
        self.running.remove(request)  # O(max_num_seqs)
        self.preempt(request)

    def update_from_output(
        self, out: SchedulerOutput, sampled: dict[str, list[int]]
    ) -> list[tuple[Request, int]]:
        """Advance `num_computed_tokens` and append the sampled tokens.

        `sampled` gives each sampling request its new tokens: one, or when it had k extra tokens,
        those kept and one more (1 to k + 1). The KV of the extra tokens not kept is wrong
        (computed for tokens that were not chosen): `num_computed_tokens` steps back over them,
        and blocks that hold nothing else (but the slots held after its tokens) go back to the
        free queue.

        Returns the requests that received tokens this step, each with how many. Stop conditions
        are checked by the engine, which owns the tokenizer (stop strings need text).
        """
        got_tokens = []
        for s in out.scheduled:
            request = s.request
            if request.is_finished:
                continue  # finished during this step (its row could not be sampled)
            num_computed = s.num_computed_tokens + s.num_new_tokens
            if s.samples:
                tokens = sampled[request.request_id]
                num_rejected = s.num_logits_rows - len(tokens)  # computed, then not kept
                num_computed -= num_rejected
                if num_rejected:  # (their blocks back: `extra_tokens.py`)
                    self.extra_tokens.tokens_rejected(self.kv, request, num_computed)
                for token in tokens:
                    request.append_output_token(token)
                got_tokens.append((request, len(tokens)))
            request.num_computed_tokens = num_computed
        return got_tokens

    def rollback_step(self, out: SchedulerOutput) -> None:
        """Undo a step whose forward pass failed: its requests will recompute from scratch.

        Their blocks may hold half-written KV, so every block this step registered in the prefix
        cache leaves it (the KV cache manager recorded exactly which), and the step's requests
        are preempted (freed, back to the front of the queue). Nothing they had produced is
        lost, and no block leaks.
        """
        self.kv.block_pool.uncache_step_blocks()
        for s in reversed(out.scheduled):  # reversed: the first ends up first in the queue
            if s.request.status == RequestStatus.RUNNING:
                self.preempt_running(s.request)

    # --- helpers ------------------------------------------------------------------------------

    def _peek_waiting(self) -> Request | None:
        while self.waiting and self.waiting[0].status == RequestStatus.FINISHED:
            self.waiting.popleft()  # an aborted request, dropped lazily
        return self.waiting[0] if self.waiting else None

    def add_to_step(
        self, out: SchedulerOutput, request: Request, num_new: int, extra: Sequence[int] = ()
    ) -> None:
        """Put `num_new` tokens of `request` (its blocks already allocated) into the step: its
        own, then those of `extra` that fit (the budget may cut some)."""
        computed, num_tokens = request.num_computed_tokens, self.num_tokens(request)
        extra = list(extra[: max(computed + num_new - num_tokens, 0)])
        samples = computed + num_new >= num_tokens
        is_prefill = computed < request.num_prompt_tokens or computed + 1 < num_tokens
        tables = self.kv.block_tables(request.request_id)  # (one per KV cache group)
        out.scheduled.append(
            ScheduledRequest(request, num_new, computed, tables, samples, is_prefill, extra)
        )
        if self.events.active:
            self.events.emit(
                RequestScheduled(
                    self.step_count,
                    request.request_id,
                    num_new,
                    computed,
                    is_prefill,
                    is_prefill and not samples,
                )
            )

    def num_tokens(self, request: Request) -> int:
        """Its tokens (the async scheduler counts those still being sampled, too)."""
        return request.num_tokens

    def preempt(self, request: Request) -> None:
        """Free `request`'s blocks and put it at the front of the waiting queue, to recompute."""
        lost = request.num_computed_tokens
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self.num_waiting += 1
        if self.events.active:
            self.events.emit(RequestPreempted(self.step_count, request.request_id, lost))
