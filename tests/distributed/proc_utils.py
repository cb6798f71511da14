"""Is a process still running? (A zombie, dead but not yet reaped, counts as not running.)"""

from __future__ import annotations

import time
from pathlib import Path


def is_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until_gone(pids, timeout_s: float) -> list[int]:
    """Wait up to timeout_s for every pid to stop running; returns those still running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [pid for pid in pids if is_running(pid)]
        if not running:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if is_running(pid)]
