"""`nanovllm lesson N --watch`: check the exercise again every time it is saved.

The loop rustlings made popular: edit, save, see the verdict, without switching windows. It
polls the file a few times a second and compares what it holds with what was checked last, so
any editor's way of saving works (in place, or a new file renamed over the old one) and saving
the same text again does not re-run anything. A poll reads and hashes one small file (the largest
exercise is 6 KB), so polling needs no file-watching library.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

POLL_SECONDS = 0.3


def fingerprint(path: Path) -> str | None:
    """A digest of the file's bytes (None while it does not exist, e.g. mid-save)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def watch(
    path: Path,
    check: Callable[[], bool],
    *,
    poll: float = POLL_SECONDS,
    max_checks: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run `check()` now and after every change of `path`'s contents, until Ctrl-C (or
    `max_checks` checks). Returns 0 if the last check passed, else 1."""
    last = fingerprint(path)
    passed = check()
    checks = 1
    try:
        while max_checks is None or checks < max_checks:
            sleep(poll)
            now = fingerprint(path)
            if now is None or now == last:
                continue
            last = now
            passed = check()
            checks += 1
    except KeyboardInterrupt:
        pass
    return 0 if passed else 1
