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

A request with `n` > 1 is n requests here, one per completion, as vLLM counts them (it runs n
child requests): each has its own timeline, first token, finish and summary, and each counts
the prompt.

Each step also counts the tokens it processed, as vLLM's `iteration_tokens_total` does: the
prompt tokens of every request that got its first token in the step (the whole prompt, once),
plus every token generated in it. And each finished request carries its sampling parameters
`n` and `max_tokens` (as the engine ran it: the rest of the context when none was given). When
a request's last completion finishes, the step also lists its `n` and its completions' most
tokens once (vLLM observes `request_params_n` and `request_max_num_generation_tokens` per parent
request, not per child).
A preempted request keeps its first `scheduled` time; the recompute shows up in the gap before
its next token. Aborted requests (a client that left) are dropped, not summarised.

At a request's first scheduling (its admission), the step records its prompt and how many of
its prompt tokens were cached (`Request.num_cached_tokens`: the prefix cache's and a KV
connector's, which the model did not compute): vLLM's `prompt_tokens_cached` and
`prompt_tokens_by_source`. A finished request's summary also carries those cached tokens (so
`num_prompt_tokens - num_cached_tokens` is the KV its prefill computed), how many times it was
preempted (`Request.num_preemptions`, which the scheduler counts), and vLLM's mean time per
output token: `decode_time / (tokens - 1)` (0 for a single token).

And each step lists what it computed, one `(tokens, context length after them, is a prefill)`
per request, from how far each request's `num_computed_tokens` moved since the previous step:
the batch perf.py estimates the step's FLOPs and bytes from, as vLLM estimates them from its
scheduler output. (With speculative decoding a step also computes the proposals it rejects;
those are not counted.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nanovllm.engine.outputs import CompletionOutput, RequestOutput
from nanovllm.engine.parallel_sampling import child_request_id
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
    # The engine's request serving it (n > 1: the completion's child), read for its preemptions
    # and progress; and each one's (num_computed_tokens, num_preemptions) when last looked at.
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
    num_generation_tokens: int  # the completion's tokens
    max_num_generation_tokens: int = 0  # the same (vLLM's name: one completion per request)
    n: int = 1
    max_tokens: int | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens not computed (prefix cache, KV connector)
    mean_time_per_output_token: float = 0.0  # decode_time / (tokens - 1)


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
    # Per request whose last completion finished in the step (vLLM's parent request, counted
    # once however many completions it has): its `n` and its completions' most tokens.
    n_params: list[int] = field(default_factory=list)
    max_num_generation_tokens: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.time_to_first_tokens
            or self.inter_token_latencies
            or self.finished_requests
            or self.admitted
            or self.batch
        )


class RequestTimer:
    """The timelines of the requests in flight, one per completion (a request with `n` > 1 has
    n, each counted as a request of its own, as vLLM counts its n child requests). Used by the
    engine thread only."""

    def __init__(self) -> None:
        self._times: dict[tuple[str, int], RequestTimes] = {}  # (request id, completion index)
        self._keys: dict[str, list[tuple[str, int]]] = {}  # request id -> its completions' keys
        self._by_engine_id: dict[str, tuple[str, int]] = {}  # the engine's id (a child's) -> key
        self._unscheduled: set[tuple[str, int]] = set()
        self._most_tokens: dict[str, int] = {}  # request id -> its finished completions' most

    def add(
        self,
        request_id: str,
        arrival: float,
        num_prompt_tokens: int,
        n: int = 1,
        max_tokens: int | None = None,
    ) -> None:
        keys = [(request_id, i) for i in range(n)]
        self._keys[request_id] = keys
        for key in keys:
            self._times[key] = RequestTimes(arrival, num_prompt_tokens, n, max_tokens)
            self._by_engine_id[_engine_id(key, n)] = key
            self._unscheduled.add(key)

    def __len__(self) -> int:
        """How many requests are followed (0 once all have finished or been aborted)."""
        return len(self._keys)

    def forget(self, request_id: str) -> None:
        """An aborted or failed request: no statistics."""
        for key in self._keys.pop(request_id, []):
            self._forget_key(key)
        self._most_tokens.pop(request_id, None)

    def _forget_key(self, key: tuple[str, int]) -> None:
        times = self._times.pop(key, None)
        self._unscheduled.discard(key)
        if times is not None:
            self._by_engine_id.pop(_engine_id(key, times.n), None)
        keys = self._keys.get(key[0])
        if keys is not None:
            if key in keys:
                keys.remove(key)
            if not keys:
                del self._keys[key[0]]

    def clear(self) -> None:
        self._times.clear()
        self._most_tokens.clear()
        self._keys.clear()
        self._by_engine_id.clear()
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
            key = self._by_engine_id.get(request.request_id)
            times = self._times.get(key) if key is not None else None
            if times is None:
                continue
            times.requests.setdefault(request.request_id, request)
            if key in self._unscheduled:  # scheduled for the first time: admitted
                times.scheduled = step_start
                self._unscheduled.discard(key)
                self._admit(stats, times, request.num_cached_tokens)
        for times in self._times.values():
            for request in times.requests.values():
                self._progress(stats, times, request)
        for output in outputs:
            for completion in output.outputs:
                self._account(stats, step_start, step_end, output, completion)
            if output.finished:
                # Forgotten however it ended, a token in its last output or not (an error ends
                # a request without one): nothing is kept for a request that is gone.
                self.forget(output.request_id)
        return stats

    def _account(
        self,
        stats: IterationStats,
        step_start: float,
        step_end: float,
        output: RequestOutput,
        completion: CompletionOutput,
    ) -> None:
        """One completion's part of a step's output."""
        key = (output.request_id, completion.index)
        times = self._times.get(key)
        if times is None:
            return  # not ours, an abort's output (forgotten when aborted), or finished before
        num_new = len(completion.delta_token_ids)
        if num_new:
            if times.scheduled is None:  # scheduled and finished within this one step
                times.scheduled = step_start
                self._unscheduled.discard(key)
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
        finish_reason = completion.finish_reason
        if finish_reason is None and output.finished:
            finish_reason = "unknown"
        if finish_reason is not None:
            self._forget_key(key)
            if times.first_token is not None:
                finished = _finished(times, completion, finish_reason, step_end)
                stats.finished_requests.append(finished)
                most = max(self._most_tokens.get(key[0], 0), finished.max_num_generation_tokens)
                self._most_tokens[key[0]] = most
            if key[0] not in self._keys and key[0] in self._most_tokens:  # its last completion
                stats.n_params.append(times.n)
                stats.max_num_generation_tokens.append(self._most_tokens.pop(key[0]))

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


def _engine_id(key: tuple[str, int], n: int) -> str:
    """The engine's id of a request's completion: the request's own, or its child's (n > 1)."""
    request_id, index = key
    return child_request_id(request_id, index) if n > 1 else request_id


def _finished(
    times: RequestTimes, completion: CompletionOutput, finish_reason: str, now: float
) -> FinishedRequestStats:
    assert times.scheduled is not None and times.first_token is not None
    num_tokens = len(completion.token_ids)
    decode_time = now - times.first_token
    return FinishedRequestStats(
        finish_reason=finish_reason,
        e2e_latency=now - times.arrival,
        queued_time=times.scheduled - times.arrival,
        prefill_time=times.first_token - times.scheduled,
        decode_time=decode_time,
        inference_time=now - times.scheduled,
        num_prompt_tokens=times.num_prompt_tokens,
        num_generation_tokens=times.num_generation_tokens,
        max_num_generation_tokens=num_tokens,
        n=times.n,
        max_tokens=times.max_tokens,
        num_preemptions=sum(r.num_preemptions for r in times.requests.values()),
        num_cached_tokens=times.num_cached_tokens,
        mean_time_per_output_token=decode_time / (num_tokens - 1) if num_tokens > 1 else 0.0,
    )
