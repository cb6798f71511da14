"""Fixtures of the visualizer's tests: the committed trace and helpers to drive the app."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def trace_path() -> Path:
    return DATA / "trace.jsonl"


@pytest.fixture(scope="session")
def trace_events(trace_path: Path) -> list:
    from nanovllm.viz.trace import read_trace

    return read_trace(trace_path)
