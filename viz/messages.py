"""Messages from the engine worker to the app (posted from the worker thread; thread-safe)."""

from __future__ import annotations

from textual.message import Message


class EngineUpdate(Message):
    """A new state is waiting in the app's mailbox. Carries nothing: the app reads the newest
    state when it handles the message, so states the UI had no time to draw are skipped."""


class EngineNotice(Message):
    """Something to tell the user: a rejected request, a command not available, an error."""

    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity
