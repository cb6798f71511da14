"""The loop that serves a workload through any engine, timing every token.

Every engine is driven through three callables: `add(i)` submits request i, `step()` does one
unit of work and returns the tokens it produced, `busy()` says whether submitted work remains.
nanovllm's and vLLM's `LLMEngine` fit it directly (`add_request`, `step`,
`has_unfinished_requests`); a transformers static batch is one `step`, and transformers'
continuous batching steps by collecting finished requests from its background thread. `drive`
submits each request once its arrival time has passed (all at once for offline runs), steps
until everything is done, and stamps each token with the time `step()` handed it over. It
imports nothing but the standard library, so vLLM's worker, in its own virtualenv without
nanovllm, runs this very code (loaded from beside itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

# What `step` returns: (request index, new token ids) for every request that got tokens.
StepResult = Iterable[tuple[int, list[int]]]


def drive(
    arrivals: list[float],
    add: Callable[[int], None],
    step: Callable[[], StepResult],
    busy: Callable[[], bool],
    on_tokens: Callable[[int], None] | None = None,
) -> tuple[float, float, list[list[int]], list[list[float]]]:
    """Serve requests 0..n-1, request i at `arrivals[i]` s after the start.

    Returns the start (`perf_counter`), the wall time, and per request its tokens and their
    times (seconds since the start)."""
    order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
    tokens: list[list[int]] = [[] for _ in arrivals]
    times: list[list[float]] = [[] for _ in arrivals]
    nxt = 0
    start = time.perf_counter()
    while nxt < len(order) or busy():
        now = time.perf_counter() - start
        while nxt < len(order) and arrivals[order[nxt]] <= now:
            add(order[nxt])
            nxt += 1
        if not busy():  # online, and nothing has arrived yet: wait for the next request
            time.sleep(max(0.0, arrivals[order[nxt]] - now))
            continue
        produced = list(step())
        t = time.perf_counter() - start
        for i, new in produced:
            tokens[i].extend(new)
            times[i].extend([t] * len(new))
        if on_tokens is not None:
            on_tokens(sum(len(new) for _, new in produced))
    return start, time.perf_counter() - start, tokens, times
