"""The link between the `disagg` scenario's two engines: the latest blocks crossing it.

Drawn from `DisaggState.link` (`link.py`): the counts on top, then one line per crossing, the
newest first, as far as it got:

    sent 24 · received 22 · loaded 18 · failed 0
    b3 (prefill) ──> hash a1b2c3 ──> b7 (decode)     loaded into the decode engine's block 7
    b4 (prefill) ──> hash 5d6e7f ──> staged          arrived, waiting in host memory
    b5 (prefill) ──> hash 9a8b7c ──> …               on the link

and the latest failures (a request whose KV did not arrive computes its prompt locally).
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.link import LOADED, RECEIVED, crossing_line
from nanovllm.viz.style import ALERT, DIM, HEADING, fit, text_style, wrap_items
from nanovllm.viz.widgets.base import StateView

STAGE_STYLES = {LOADED: Style(color="#98c379"), RECEIVED: Style(color="#61afef")}


class LinkView(StateView):
    """Shown with a `DisaggState` (the app hands it the pair, not one engine's state)."""

    def watched(self, state: Any, status: DriverStatus | None) -> tuple[Any, ...]:
        return (getattr(state, "link", None),)

    def render(self) -> Text:
        link = getattr(self.state, "link", None)
        width, height = self.size.width, self.size.height
        if width < 1 or height < 1:
            return Text()
        if link is None:
            return Text("no second engine", DIM)
        counts = [
            f"sent {link.num_sent}",
            f"received {link.num_received}",
            f"loaded {link.num_loaded}",
            f"failed {link.num_failed}",
        ]
        lines = wrap_items(counts, width, HEADING)
        compact = width < len("b25 (prefill) ──> hash 12c71e ──> b38 (decode)")
        if compact:  # below 150 columns the link narrows: each engine needs the room
            lines.append(Text("prefill ─hash─> decode", DIM))
        top = len(lines)
        requests = self.state.decode.requests
        for c in reversed(link.crossings):
            line = Text(crossing_line(c, compact), STAGE_STYLES.get(c.stage, DIM))
            info = requests.get(c.request_id) if c.request_id else None
            if info is not None and c.request_id == self.selected:
                line.stylize(text_style(info.slot))
            lines.append(line)
        if not link.crossings:
            lines.append(Text("nothing sent yet", DIM))
        for request_id, error in reversed(link.failures):
            lines.insert(top, Text(f"{request_id} computed locally: {error}", ALERT))
        lines = [fit(line, width) for line in lines]
        return Text("\n").join(lines[:height])
