"""Event traces: a run written as JSON lines, one `event_to_dict` per line, and read back.

A trace *is* a run (see `nanovllm.events`): `--record` writes one while the engine works and
`--replay` plays one back with no model at all, which is also how the tests drive the app
deterministically. Replay groups the events into frames, one per engine step, each ending with
the step's `StepSummary`, so a replayed step looks exactly like a live one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from nanovllm.events import Event, StepSummary, event_from_dict, event_to_dict


class TraceWriter:
    """Append events to a JSON-lines file; usable directly as an engine subscriber."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8")

    def __call__(self, event: Event) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event_to_dict(event), ensure_ascii=False) + "\n")

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def write_trace(path: str | Path, events: Iterable[Event]) -> None:
    writer = TraceWriter(path)
    try:
        for event in events:
            writer(event)
    finally:
        writer.close()


def read_trace(path: str | Path) -> list[Event]:
    """Every event of a trace. A bad line is a ValueError naming the file and line number."""
    events = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                events.append(event_from_dict(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not an event: {exc}") from exc
    return events


def frames(events: Iterable[Event]) -> Iterator[list[Event]]:
    """Split events into per-step frames, each ending with its `StepSummary`.

    Events before the first step (EngineStarted, arrivals) join the first frame; trailing events
    with no summary after them form a last frame of their own.
    """
    frame: list[Event] = []
    for event in events:
        frame.append(event)
        if isinstance(event, StepSummary):
            yield frame
            frame = []
    if frame:
        yield frame
