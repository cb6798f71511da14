"""Helpers shared by the visualizer's app tests."""

from __future__ import annotations

import time
from collections.abc import Callable


async def wait_until(pilot, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let the app run until `predicate()` holds (the worker is a real thread), then settle."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.pause()
