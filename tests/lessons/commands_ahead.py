"""Slow commands of a test session run ahead of their tests, two at a time.

Many of the lessons' tests run `nanovllm lesson N --run ...` in a process of its own and then
read its output. Each such process mostly keeps one core busy (Python driving a small model),
so one after another they left the CI machine's second core idle for minutes. `CommandsAhead`
starts every selected test's command as soon as the first of them asks, in the session's order,
`WORKERS` at a time; each test then waits for its own command's result and checks it as before.

A command's `prepare` (writing the learner's files it runs against) runs in the worker, right
before the command, in a folder of its own. The tests that do not ask for a command run while the
commands do. The last command's test waits for it, so none outlives its file's tests; a session
that stops early cancels the commands not yet started.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

# The CI machine has two cores.
WORKERS = 2


class CommandsAhead:
    """Commands keyed by test id, run `WORKERS` at a time in the order they were added."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="command-ahead")
        self._results: dict[str, Future] = {}

    def add(self, key: str, run: Callable[[], subprocess.CompletedProcess]) -> None:
        self._results[key] = self._pool.submit(run)

    def result(self, key: str) -> subprocess.CompletedProcess:
        """The command's completed process (its exception, re-raised, if it raised one)."""
        return self._results[key].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
