"""AsyncScheduler: schedule step N+1 before step N's tokens are known (vLLM's async scheduling).

The plain Scheduler runs in series with the forward pass: it schedules step N only after step N-1
has sampled its tokens, because a decoding request's next input *is* that token. With async
scheduling (`engine/async_step.py`) the engine schedules step N+1 while step N's forward pass is
still running. It assumes that every request sampling in step N gets exactly one token, and
counts that token, not yet known, as an *output placeholder* (vLLM's `num_output_placeholders`):

    known tokens:  p0 p1 p2 o0 o1          num_tokens = 5
    placeholder:                  ?        num_output_placeholders = 1 (step N is sampling it)
    step N+1:                     ^ computes "?" at position 5; its id is filled in when step N
                                    has sampled it, just before step N+1's forward pass

So the Scheduler's one rule still holds, with `num_tokens` counting the placeholders: a request
is given `num_tokens - num_computed_tokens` tokens. Two things move:

- `num_computed_tokens` advances when a step is *scheduled* (step N+1 must already see step N's
  tokens as computed), not when its output comes back;
- `update_from_output` only appends the sampled tokens and takes the placeholders back. A request
  that stopped at step N (or was aborted) is skipped when step N+1's output comes: its token from
  step N+1 is dropped, and its blocks were freed when it stopped.

A preempted request (its blocks taken back while step N was computing its token) still gets that
token: it was computed on blocks that were intact until step N ended, and the request will
recompute everything from its prompt anyway.

What cannot run this way is refused at configuration (`EngineConfig.check_async_scheduling`).
"""

from __future__ import annotations

from nanovllm.core.scheduler import Scheduler, SchedulerOutput
from nanovllm.request import FinishReason, Request, RequestStatus


class AsyncScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Per request id: tokens its scheduled steps will sample that are not known yet.
        self.num_output_placeholders: dict[str, int] = {}
        # Per step in flight: the blocks it registered in the prefix cache (their KV is written
        # by that step or the one before), to take back out if it fails (`rollback_step`).
        self.cached_by_step: dict[int, list] = {}

    def num_tokens(self, request: Request) -> int:
        return request.num_tokens + self.num_output_placeholders.get(request.request_id, 0)

    def schedule(self) -> SchedulerOutput:
        # A request whose last token (by max_tokens) is being sampled needs no step more: it sits
        # this one out, keeping its place (and the plain loop's steps).
        running = self.running
        last = {id(r) for r in running if self.num_tokens(r) - r.num_prompt_tokens >= r.max_tokens}
        if last:
            self.running = [r for r in running if id(r) not in last]
        self.kv.block_pool.step_cached_blocks = []  # (a list of this step's own: two steps are in flight)
        out = super().schedule()
        self.cached_by_step = {out.step - 1: self.cached_by_step.get(out.step - 1, [])}
        self.cached_by_step[out.step] = self.kv.block_pool.step_cached_blocks
        if last:
            still, before = {id(r) for r in self.running}, {id(r) for r in running}
            admitted = [r for r in self.running if id(r) not in before]
            self.running = [r for r in running if id(r) in last or id(r) in still] + admitted
        # The step's tokens count as computed from now on, and each sampling request owes one
        # token more (vLLM's `_update_after_schedule`).
        for s in out.scheduled:
            s.request.num_computed_tokens = s.num_computed_tokens + s.num_new_tokens
            if s.samples:
                rid = s.request.request_id
                self.num_output_placeholders[rid] = self.num_output_placeholders.get(rid, 0) + 1
        return out

    def update_from_output(
        self, out: SchedulerOutput, sampled: dict[str, list[int]]
    ) -> list[tuple[Request, int]]:
        """Append each request's sampled token; its `num_computed_tokens` is already advanced."""
        got_tokens = []
        for s in out.scheduled:
            request = s.request
            if request.is_finished or not s.samples:
                continue  # it stopped at the step before (or was aborted): this token is dropped
            self._take_placeholder(request.request_id)
            for token in sampled[request.request_id]:
                request.append_output_token(token)
            got_tokens.append((request, len(sampled[request.request_id])))
        return got_tokens

    def cache_blocks(self, request: Request) -> None:
        """Put the blocks now full of known tokens in the prefix cache (vLLM's `cache_blocks`):
        when step N+1 was scheduled, step N's token was a placeholder, which no hash can name."""
        if request.status == RequestStatus.RUNNING and self.kv.enable_prefix_caching:
            self.kv.allocate_slots(request, 0)  # (0 more slots: it only caches what is full)

    def finish_request(self, request: Request, reason: FinishReason) -> None:
        super().finish_request(request, reason)
        self.num_output_placeholders.pop(request.request_id, None)  # its steps ahead are dropped

    def rollback_step(self, out: SchedulerOutput) -> None:
        """Undo a failed step (and, newest first, the one scheduled after it)."""
        self.kv.block_pool.step_cached_blocks = self.cached_by_step.pop(out.step, [])
        for s in out.scheduled:
            if s.samples and not s.request.is_finished:
                self._take_placeholder(s.request.request_id)
        super().rollback_step(out)

    def _take_placeholder(self, rid: str) -> None:
        left = self.num_output_placeholders.get(rid, 0) - 1
        if left > 0:
            self.num_output_placeholders[rid] = left
        else:
            self.num_output_placeholders.pop(rid, None)
