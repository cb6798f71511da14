"""Per-request latencies: each request's timeline, turned into what a dashboard plots.

The engine thread keeps one `RequestTimes` per request it serves and, after every step,
hands the observers (`/metrics`, see metrics.py) an `IterationStats`: the time to first token of
each request that got its first token in that step, the inter-token latency of each that got a
later one, and the summary of each that finished. These are vLLM's per-request statistics
(`vllm/v1/metrics/stats.py`), measured on one clock (`time.monotonic()`, seconds):

    arrival      the server handed the request to the engine thread (AsyncLLMEngine.add_request)
    scheduled    the start of the first step that scheduled it (its wait in the queue ends)
    first_token  the end of the step that produced its first token
    last_token   the end of the step that produced its latest token

    queued_time       = scheduled - arrival      time spent waiting, before any compute
    time to 1st token = first_token - arrival
    inter-token       = token time - previous token time   (one per token after the first)
    prefill_time      = first_token - scheduled
    decode_time       = finished - first_token
    inference_time    = finished - scheduled
    e2e_latency       = finished - arrival

So, for every finished request, TTFT + the sum of its inter-token latencies = its e2e latency.

Each step also counts the tokens it processed, as vLLM's `iteration_tokens_total` does: the
prompt tokens of every request that got its first token in the step (the whole prompt, once),
plus every token generated in it. And each finished request carries its sampling parameters
`n` and `max_tokens` (as the engine ran it: the rest of the context when none was given).
A preempted request keeps its first `scheduled` time; the recompute shows up in the gap before
its next token. Aborted requests (a client that left) are dropped, not summarised.

At a request's first scheduling (its admission), the step records its prompt and how many of
its prompt tokens were cached (`Request.num_cached_tokens`: the prefix cache's and a KV
connector's, which the model did not compute): vLLM's `prompt_tokens_cached` and
`prompt_tokens_by_source`. A finished request's summary also carries those cached tokens (so
`num_prompt_tokens - num_cached_tokens` is the KV its prefill computed), how many times it was
preempted (all its `n` completions together: `Request.num_preemptions`, which the scheduler
counts), and vLLM's mean time per output token: `decode_time / (tokens - 1)` over its longest
completion (0 for a single token).

And each step lists what it computed, one `(tokens, context length after them, is a prefill)`
per request, from how far each request's `num_computed_tokens` moved since the previous step:
the batch perf.py estimates the step's FLOPs and bytes from, as vLLM estimates them from its
scheduler output. (With speculative decoding a step also computes the proposals it rejects;
those are not counted.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nanovllm.engine.outputs import RequestOutput
from nanovllm.request import Request


@dataclass
class RequestTimes:
    """One request's timeline (monotonic seconds) and token counts, while it runs."""

    arrival: float
    num_prompt_tokens: int
    n: int = 1
    max_tokens: int | None = None
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_generation_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens cached at its first admission
    # The engine's requests serving it (n > 1: its children), read for their preemptions and
    # progress; and each one's (num_computed_tokens, num_preemptions) when last looked at.
    requests: dict[str, Request] = field(default_factory=dict)
    progress: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class FinishedRequestStats:
    finish_reason: str
    e2e_latency: float
    queued_time: float
    prefill_time: float
    decode_time: float
    inference_time: float
    num_prompt_tokens: int
    num_generation_tokens: int  # all n completions together
    max_num_generation_tokens: int = 0  # the longest of the n completions
    n: int = 1
    max_tokens: int | None = None
    num_preemptions: int = 0  # all n completions together
    num_cached_tokens: int = 0  # prompt tokens not computed (prefix cache, KV connector)
    mean_time_per_output_token: float = 0.0  # decode_time / (longest completion - 1)


@dataclass
class IterationStats:
    """What one engine step changed in the per-request statistics."""

    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    num_prompt_tokens: int = 0  # prompts of the requests that got their first token
    num_generation_tokens: int = 0  # tokens generated in the step
    # (prompt tokens, cached prompt tokens) of each request scheduled for the first time.
    admitted: list[tuple[int, int]] = field(default_factory=list)
    # (tokens computed, context length after them, is a prefill) of each request the step ran:
    # what perf.py estimates the step's FLOPs and bytes from.
    batch: list[tuple[int, int, bool]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.time_to_first_tokens
            or self.inter_token_latencies
            or self.finished_requests
            or self.admitted
            or self.batch
        )


class RequestTimer:
    """The timelines of the requests in flight. Used by the engine thread only."""

    def __init__(self) -> None:
        self._times: dict[str, RequestTimes] = {}
        self._unscheduled: set[str] = set()

    def add(
        self,
        request_id: str,
        arrival: float,
        num_prompt_tokens: int,
        n: int = 1,
        max_tokens: int | None = None,
    ) -> None:
        self._times[request_id] = RequestTimes(arrival, num_prompt_tokens, n, max_tokens)
        self._unscheduled.add(request_id)

    def __len__(self) -> int:
        """How many requests are followed (0 once all have finished or been aborted)."""
        return len(self._times) + len(self._unscheduled - self._times.keys())

    def forget(self, request_id: str) -> None:
        """An aborted or failed request: no statistics."""
        self._times.pop(request_id, None)
        self._unscheduled.discard(request_id)

    def clear(self) -> None:
        self._times.clear()
        self._unscheduled.clear()

    def step(
        self,
        step_start: float,
        step_end: float,
        running: Iterable[Request],
        outputs: Iterable[RequestOutput],
    ) -> IterationStats:
        """Account for one step, which began at `step_start` and returned at `step_end`."""
        stats = IterationStats()
        for request in running:
            request_id = request.parent_id or request.request_id  # n > 1: the parent's
            times = self._times.get(request_id)
            if times is None:
                continue
            times.requests.setdefault(request.request_id, request)
            if request_id in self._unscheduled:  # scheduled for the first time: admitted
                times.scheduled = step_start
                self._unscheduled.discard(request_id)
                self._admit(stats, times, request.num_cached_tokens)
        for times in self._times.values():
            for request in times.requests.values():
                self._progress(stats, times, request)
        for output in outputs:
            times = self._times.get(output.request_id)
            if times is None:
                continue  # not ours, or an abort's output (forgotten when it was aborted)
            num_new = sum(len(c.delta_token_ids) for c in output.outputs)
            if num_new:
                if times.scheduled is None:  # scheduled and finished within this one step
                    times.scheduled = step_start
                    self._unscheduled.discard(output.request_id)
                    self._admit(stats, times, output.num_cached_tokens)
                    computed = times.num_prompt_tokens - output.num_cached_tokens
                    if computed > 0:  # (never seen running: its one step was its prefill)
                        stats.batch.append((computed, times.num_prompt_tokens, True))
                if times.first_token is None:
                    times.first_token = step_end
                    stats.time_to_first_tokens.append(step_end - times.arrival)
                    stats.num_prompt_tokens += times.num_prompt_tokens
                else:
                    stats.inter_token_latencies.append(step_end - times.last_token)
                times.last_token = step_end
                times.num_generation_tokens += num_new
                stats.num_generation_tokens += num_new
            if output.finished:
                # Forgotten however it ended, a token in its last output or not (an error ends
                # a request without one): nothing is kept for a request that is gone.
                self.forget(output.request_id)
                if times.first_token is not None:
                    stats.finished_requests.append(_finished(times, output, step_end))
        return stats

    @staticmethod
    def _progress(stats: IterationStats, times: RequestTimes, request: Request) -> None:
        """The tokens `request` computed in this step, from how far its KV got since the last
        look. Admitted since then (first seen, or preempted since: it had no KV then, or its
        count of preemptions grew): its cached tokens were not computed. Preempted and waiting,
        it computed none (`num_computed_tokens` is 0)."""
        num_computed, num_preemptions = request.num_computed_tokens, request.num_preemptions
        before, seen_preemptions = times.progress.get(request.request_id, (-1, num_preemptions))
        admitted = before <= 0 or seen_preemptions != num_preemptions
        if admitted:
            before = request.num_cached_tokens if num_computed else 0
        times.progress[request.request_id] = (num_computed, num_preemptions)
        if num_computed > before:
            num_new = num_computed - before
            stats.batch.append((num_new, num_computed, admitted or num_new > 1))

    @staticmethod
    def _admit(stats: IterationStats, times: RequestTimes, num_cached_tokens: int) -> None:
        times.num_cached_tokens = num_cached_tokens
        stats.admitted.append((times.num_prompt_tokens, num_cached_tokens))


def _finished(times: RequestTimes, output: RequestOutput, now: float) -> FinishedRequestStats:
    assert times.scheduled is not None and times.first_token is not None
    longest = max(len(c.token_ids) for c in output.outputs)
    decode_time = now - times.first_token
    return FinishedRequestStats(
        finish_reason=output.outputs[0].finish_reason or "unknown",
        e2e_latency=now - times.arrival,
        queued_time=times.scheduled - times.arrival,
        prefill_time=times.first_token - times.scheduled,
        decode_time=decode_time,
        inference_time=now - times.scheduled,
        num_prompt_tokens=times.num_prompt_tokens,
        num_generation_tokens=times.num_generation_tokens,
        max_num_generation_tokens=longest,
        n=times.n,
        max_tokens=times.max_tokens,
        num_preemptions=sum(r.num_preemptions for r in times.requests.values()),
        num_cached_tokens=times.num_cached_tokens,
        mean_time_per_output_token=decode_time / (longest - 1) if longest > 1 else 0.0,
    )
