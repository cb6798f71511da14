"""The contract every engine adapter keeps, so the suite can treat them alike.

    engine.load()          load weights and allocate everything; never timed
    engine.run(workload)   one timed pass over the workload -> EngineRun
    engine.close()         free what it holds (a subprocess, a background thread)

`run` starts its clock when the first request could be submitted and stops it at the last
token; it honours each request's `arrival_s` (online runs) and returns only the tokens each
request asked for. Warm-up is simply a `run` on a small workload whose result is discarded.

`on_tokens(n)` reports progress to the suite's progress bar; adapters that cannot see tokens
as they come (vLLM in its own process) report them all at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from nanovllm.bench.records import EngineRun
from nanovllm.bench.workload import Workload

TokenCallback = Callable[[int], None]


class Engine(Protocol):
    name: str

    def load(self) -> dict: ...

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun: ...

    def close(self) -> None: ...


class EngineUnavailable(RuntimeError):
    """This engine cannot run here (not installed, failed to start); the suite skips it."""


def wait_until(start: float, arrival_s: float) -> None:
    """Sleep until `arrival_s` seconds after `start` (online runs with nothing to do)."""
    delay = start + arrival_s - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
