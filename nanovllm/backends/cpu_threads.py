"""A thread governor: as many compute threads as the machine has cores free, step by step.

A decode step on a CPU is hundreds of short parallel regions (torch's matmuls, the numba
kernels), each of which ends when its slowest thread does. With every core its own, the
threads that finish first spin briefly and the next region starts at once. When another
process keeps a core busy, one of our threads waits for a time slice at every region, and the
whole step waits with it: on 2 cores a step can take several times as long as on 1 thread.

So before a step the CPU runner asks the governor how many threads to run. It looks at how
busy the CPUs this process may run on were since its last look, minus this process's own CPU
time (`/proc/stat` and `os.times`, Linux only): that is the work of other processes, in cores.
It runs `max_threads` threads while the others leave that many cores free, and fewer, down to
one, when they do not. Two thresholds keep it from flapping: it drops a thread once the others
take half a core of the ones it uses, and takes the thread back once they take less than a
third of a core.

Threads of this process compete for the cores too (a grammar compiling, the server's
tokenizers), and those `/proc/stat` cannot tell from the engine's own. For them it reads how long
this process's threads waited, runnable, for a CPU (`/proc/self/task/*/schedstat`): when that
comes to `WAIT_DROP` of a core, it gives up a thread and holds off taking it back for `hold`
seconds, twice as long each time the wait comes back soon after (at most `MAX_HOLD`).

Only the time the engine spends in steps counts: a look whose window holds a pause between steps
longer than `interval` (an idle server, a process that ran while this one waited) decides
nothing and starts a new window.

Cost: two small file reads every `interval` seconds (0.25 s), nothing on the steps between.
Processes at a lower priority (a positive nice) are not counted: the kernel's scheduler lets
ours run first, so they do not slow a step.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

DROP_AT = 0.5  # cores the others must take beyond the free ones before we give up a thread
TAKE_BACK_BELOW = 1 / 3  # ... and at most this, for a thread to be taken back
WAIT_DROP = 0.25  # cores' worth of this process's threads waiting for a CPU: one thread fewer
BASE_HOLD, MAX_HOLD = 1.0, 16.0  # seconds before a thread given up for waiting is taken back


def read_busy_seconds(cpus: set[int], path: str = "/proc/stat") -> float | None:
    """Seconds the CPUs in `cpus` spent running anything but niced processes, since boot
    (user, system, irq, softirq and steal time: `proc(5)`), or None where there is no
    /proc/stat."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, _nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
        ticks += user + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


def read_waited_seconds(tasks: str = "/proc/self/task") -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a CPU (the second
    field of each thread's `schedstat`), or None where the kernel does not keep it."""
    total = 0
    try:
        for tid in os.listdir(tasks):
            try:
                with open(f"{tasks}/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue  # (a thread that ended meanwhile)
    except (OSError, IndexError, ValueError):
        return None
    return total / 1e9


def own_cpu_seconds() -> float:
    """User and system seconds of every thread of this process."""
    t = os.times()
    return t.user + t.system


class ThreadGovernor:
    """Chooses the step's thread count from the other processes' CPU use (module docstring)."""

    def __init__(
        self,
        max_threads: int,
        interval: float = 0.25,
        busy_seconds: Callable[[], float | None] | None = None,
        own_seconds: Callable[[], float] = own_cpu_seconds,
        waited_seconds: Callable[[], float | None] = read_waited_seconds,
        clock: Callable[[], float] = time.monotonic,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self.interval = interval
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.num_cpus = len(cpus) or (os.cpu_count() or 1)
        self.busy_seconds = busy_seconds or (lambda: read_busy_seconds(cpus))
        self.own_seconds = own_seconds
        self.clock = clock
        self.set_threads = set_threads
        self.waited_seconds = waited_seconds
        self.hold = BASE_HOLD
        self.held_until = self.taken_back_at = -math.inf
        self.last = self._sample()
        self.step_ended_at: float | None = None  # (None: no step since `last`)

    def _sample(self) -> tuple[float, float | None, float, float | None]:
        return self.clock(), self.busy_seconds(), self.own_seconds(), self.waited_seconds()

    def tick(self) -> int:
        """Called before each step: the threads to run it on (set through `set_threads`)."""
        now = self.clock()
        if self.step_ended_at is None or now - self.step_ended_at > self.interval:
            self.last = self._sample()  # (idle since: what others did then is no contention)
            return self.threads
        if now - self.last[0] < self.interval:
            return self.threads
        sample = self._sample()
        (t0, busy0, own0, waited0), (t1, busy1, own1, waited1) = self.last, sample
        self.last = sample
        if busy0 is None or busy1 is None:  # (no /proc/stat: leave the threads as they are)
            return self.threads
        others = max((busy1 - busy0) - (own1 - own0), 0.0) / (t1 - t0)  # in cores
        waiting = 0.0 if waited0 is None or waited1 is None else (waited1 - waited0) / (t1 - t0)
        threads = self.decide(others, waiting, t1)
        if threads != self.threads:
            logger.debug(
                "threads %d -> %d (others use %.2f cores, ours wait for %.2f)",
                self.threads, threads, others, waiting,
            )  # fmt: skip
            self.set_threads(threads)
            self.threads = threads
        return self.threads

    def decide(self, others: float, waiting: float, now: float) -> int:
        """The thread count for other processes using `others` cores while this process's
        threads waited for `waiting` cores' worth of time."""
        if waiting >= WAIT_DROP and self.threads > 1:
            soon = now - self.taken_back_at < 2 * self.hold  # (it came back right after a hold)
            self.hold = min(2 * self.hold, MAX_HOLD) if soon else BASE_HOLD
            self.held_until = now + self.hold
            return min(self.threads - 1, self.choose(others))
        wanted = self.choose(others)
        if wanted > self.threads:
            if now < self.held_until:
                return self.threads
            self.taken_back_at = now
        return wanted

    def step_ended(self) -> None:
        """Called after each step."""
        self.step_ended_at = self.clock()

    def choose(self, others: float) -> int:
        """The thread count for other processes using `others` cores."""
        free = self.num_cpus - others
        if free < self.threads - DROP_AT:  # (they take over half a core of ours)
            wanted = math.floor(free + DROP_AT)
        elif free >= self.threads + 1 - TAKE_BACK_BELOW:  # (a whole core is free again)
            wanted = math.floor(free + TAKE_BACK_BELOW)
        else:
            wanted = self.threads
        return max(1, min(self.max_threads, wanted))


def thread_governor(environ: dict[str, str] | os._Environ = os.environ) -> ThreadGovernor | None:
    """The CPU runner's governor over torch's current thread count, or None: one thread, no
    /proc/stat, or `NANOVLLM_CPU_THREAD_GOVERNOR=0`."""
    max_threads = torch.get_num_threads()
    if environ.get("NANOVLLM_CPU_THREAD_GOVERNOR", "1") == "0" or max_threads < 2:
        return None
    if read_busy_seconds(set(os.sched_getaffinity(0))) is None:
        return None
    return ThreadGovernor(max_threads)
