"""Wait for an idle machine before each timed run, so that no engine runs beside another's leftovers.

Why: engines do not stop using the CPU the moment their run returns (vLLM's CPU worker keeps a
core busy for a few seconds: README.md, "How each number is made"). The repeats are interleaved
(A B C A B C), so without a pause the engine that runs next shares the machine's cores with
that leftover work for the first seconds of its run, a handicap that falls on whichever engine
follows vLLM, every repeat.

How: the machine-wide CPU counters of Linux's /proc/stat, read twice `window` seconds apart;
the machine is idle when less than `threshold` of its CPU time in between was busy (user,
nice, system, irq, softirq; not idle, iowait or steal). Waits at most `timeout` seconds. Where
there is no /proc/stat (macOS), it does not wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def read_cpu_times() -> tuple[int, int] | None:
    """(busy, total) CPU ticks of the whole machine since boot, or None without /proc/stat."""
    try:
        first = PROC_STAT.read_text().split("\n", 1)[0]
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, first.split()[1:9])
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


def wait_until_idle(
    threshold: float = 0.1,
    window: float = 0.2,
    timeout: float = 3.0,
    read: Callable[[], tuple[int, int] | None] = read_cpu_times,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Return once the machine's busy share over one `window` is under `threshold`, or after
    `timeout` seconds; the seconds waited (as the windows add up)."""
    waited = 0.0
    before = read()
    while before is not None and waited < timeout:
        sleep(window)
        waited += window
        after = read()
        if after is None:
            break
        busy, total = after[0] - before[0], after[1] - before[1]
        if total > 0 and busy / total < threshold:
            break
        before = after
    return waited
