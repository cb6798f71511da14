"""`StateView`: the base of every view, a widget that draws part of a `VizState`."""

from __future__ import annotations

from typing import Any

from textual.events import Resize
from textual.widget import Widget

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import VizState
from nanovllm.viz.style import fit_plain


class StateView(Widget):
    """Holds the latest state, the selected request and the driver's status.

    Subclasses say which parts of the state they draw (`watched`) and render from
    `self.state`; `show` skips the redraw when none of those parts changed, which keeps the
    frame cost low when the engine steps faster than the terminal can draw.
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.state = VizState()
        self.selected: str | None = None
        self.status: DriverStatus | None = None
        self._key: tuple[Any, ...] | None = None
        self._titles: tuple[str, str] | None = None

    def set_titles(self, title: str, subtitle: str = "") -> None:
        """The border's title and subtitle, fitted to the width now and on every resize."""
        self._titles = (title, subtitle)
        self._fit_titles()

    def _fit_titles(self) -> None:
        if self._titles is None:
            return
        # The border draws `╭─ title ─╮`: six cells of the outer width are the border's.
        room = max(0, self.outer_size.width - 6) if self.outer_size.width else 1000
        title, subtitle = (fit_plain(t, room) for t in self._titles)
        if (self.border_title, self.border_subtitle) != (title, subtitle):
            self.border_title, self.border_subtitle = title, subtitle

    def on_resize(self, event: Resize) -> None:
        self._fit_titles()

    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        """The objects this view draws; compared by identity (states are immutable)."""
        return (state,)

    def show(self, state: VizState, selected: str | None, status: DriverStatus | None) -> None:
        key = self.watched(state, status)
        old = self._key
        changed = (
            old is None
            or selected != self.selected
            or len(old) != len(key)
            or any(a is not b for a, b in zip(old, key))
        )
        self.state, self.selected, self.status, self._key = state, selected, status, key
        if changed:
            height = self.styles.height
            self.refresh(layout=height is not None and height.is_auto)
