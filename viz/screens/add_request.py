"""A small modal that asks for a prompt; the app sends it to the engine worker."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class AddRequestScreen(ModalScreen[str | None]):
    """Dismisses with the typed prompt, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="add-request"):
            yield Label("Prompt for a new request (enter to send, escape to cancel):")
            yield Input(placeholder="ROMEO:", id="prompt")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
