"""The KV connector beside the free block queue: its tier's slots and the step's traffic.

Shown only when the engine runs a KV connector (`app.py` marks the screen `-tier`). For the
OffloadingConnector (its host tier is CPU memory, the heading says so) every host slot is one
character, in slot order, eight to a group and each
row labelled with its first slot (`t16`): `■` holds a prefix, `·` empty, `+` (green) saved this
step, `⇡` (purple) copied into a device block this step, `▾` the least recently used entry,
the one a full tier drops next; what the latest move touched is white. Above them the counts
(`+` saved, `⇡` loaded, `✕` dropped when the words do not fit); under them the step's traffic
in one line:

    step 12: loaded t0→b9; saved b3→t0, b7→t1; dropped t1

SharedStorageConnector has no slots: the panel counts the blocks saved to and loaded from
storage, and the line names the device blocks.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text
from textual.geometry import Size

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import StepRecord, VizState
from nanovllm.viz.style import (
    ALERT,
    CACHED,
    DIM,
    FLASH,
    FREE,
    HEADING,
    NEW,
    PULLED,
    fit,
    wrap_items,
)
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.words import count

MAX_LINES = 3  # of slots, when the panel may grow
FILLED, SAVED, LOADED, NEXT_DROPPED, EMPTY, DROPPED = "■", "+", "⇡", "▾", "·", "✕"
MOVED = Style(color="white")  # a traffic line with transfers in it


def traffic_line(record: StepRecord) -> str:
    """The step's transfers: tier slot → device block loads (the hits, first: a narrow panel
    cuts the line's end), device block → slot saves, dropped slots."""
    parts = []
    if record.loaded:
        moves = (f"t{t}→b{b}" if t >= 0 else f"b{b}" for t, b in record.loaded)
        parts.append("loaded " + ", ".join(moves))
    if record.saved:
        moves = (f"b{b}→t{t}" if t >= 0 else f"b{b}" for b, t in record.saved)
        parts.append("saved " + ", ".join(moves))
    if record.dropped:
        parts.append("dropped " + ", ".join(f"t{t}" for t in record.dropped))
    if record.load_failed:
        parts.append("load failed: " + " ".join(record.load_failed))
    return f"step {record.step}: " + ("; ".join(parts) if parts else "no transfers")


def slot_rows(cells: list[tuple[str, Style]], width: int, max_lines: int) -> list[Text]:
    """The slots in rows of whole groups of 8, each row labelled with its first slot (`t16`);
    a row cut short by `max_lines` ends with `…`."""
    label = len(f"t{max(len(cells) - 1, 0)} ")
    groups = max(1, (width - label + 1) // 9)  # 8 cells and a space each
    per_row = groups * 8 if width - label >= 8 else max(1, width - label)
    rows = []
    for first in range(0, len(cells), per_row):
        row = Text(f"t{first}".ljust(label), DIM)
        for i, (char, style) in enumerate(cells[first : first + per_row]):
            if i and i % 8 == 0:
                row.append(" ")
            row.append(char, style)
        rows.append(row)
    if len(rows) > max_lines:
        rows = rows[:max_lines]
        last = rows[-1]
        if len(last) + 1 > width:
            last.right_crop(len(last) + 1 - width)
        last.append("…", DIM)
    return rows


class TierView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.tier, state.draft, state.last_step)

    def show(self, state: VizState, selected: str | None, status: DriverStatus | None) -> None:
        super().show(state, selected, status)
        tier = state.tier
        title = tier.connector or "KV connector"
        subtitle = "t: host slot · b: device block" if tier.has_slots else "b: device block"
        if self._titles != (title, subtitle):
            self.set_titles(title, subtitle)

    def _record(self) -> StepRecord | None:
        state = self.state
        return state.draft if state.draft.events else state.last_step

    def _cells(self) -> list[tuple[str, Style]]:
        """One (character, style) per tier slot, in slot order."""
        state, tier = self.state, self.state.tier
        record = self._record()
        saved = {t for _, t in record.saved} if record else set()
        loaded = {t for t, _ in record.loaded} if record else set()
        # What the latest event touched (at a step boundary: the whole step), as `latest_changes`.
        events = state.draft.events[-1:] or (state.last_step.events if state.last_step else ())
        touched = {getattr(e, "tier_slot", -1) for e in events}
        next_dropped = tier.next_dropped()
        cells = []
        for slot, block_hash in enumerate(tier.slots):
            if slot in saved:
                char, style = SAVED, NEW
            elif slot in loaded:
                char, style = LOADED, PULLED
            elif block_hash is None:
                char, style = EMPTY, FREE
            else:
                char, style = (NEXT_DROPPED if slot == next_dropped else FILLED), CACHED
            cells.append((char, FLASH if slot in touched else style))
        return cells

    def _heading(self, width: int) -> Text:
        """The counts, in words when they fit, else in the legend's marks."""
        t = self.state.tier
        failed = f" · failed {t.num_failed}" if t.num_failed else ""
        if t.has_slots:  # the OffloadingConnector's host tier: slots in CPU memory
            text = (
                f"CPU memory {t.num_filled}/{t.num_blocks} slots · saved {t.num_saved} · loaded "
                f"{t.num_loaded} · dropped {t.num_dropped}{failed}"
            )
            if len(text) > width:
                text = (
                    f"CPU {t.num_filled}/{t.num_blocks} · {SAVED}{t.num_saved} "
                    f"{LOADED}{t.num_loaded} {DROPPED}{t.num_dropped}{failed}"
                )
        else:
            text = f"{t.role} · saved {t.num_saved} · loaded {count(t.num_loaded, 'block')}{failed}"
        return Text(text, HEADING)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The heading, the slots over at most `MAX_LINES` lines, the traffic, the legend."""
        tier = self.state.tier
        if tier.connector is None or width < 1:
            return 1
        slots = len(slot_rows(self._cells(), width, MAX_LINES)) if tier.has_slots else 0
        return 2 + slots + len(wrap_items(self._legend(), width))

    def _legend(self) -> list[str]:
        if self.state.tier.has_slots:
            return [
                f"{FILLED} holds a prefix",
                f"{SAVED} saved",
                f"{LOADED} loaded",
                f"{NEXT_DROPPED} dropped next",
                f"{EMPTY} empty",
                f"{DROPPED} dropped",
            ]
        return ["saved: KV written to files", "loaded: read back, not computed"]

    def render(self) -> Text:
        tier = self.state.tier
        width, height = self.size.width, self.size.height
        if width < 1 or height < 1:
            return Text()
        if tier.connector is None:
            return Text("no KV connector", DIM)
        record = self._record()
        style = DIM
        if record is not None and record.load_failed:
            style = ALERT
        elif record is not None and (record.saved or record.loaded or record.dropped):
            style = MOVED
        traffic = Text(traffic_line(record) if record else "no step yet", style)
        lines = [self._heading(width)]
        # The legend, whole, over as many lines as it needs; the slots get what is left (at
        # least a line), and in a very short panel the legend gives way, a line at a time.
        legend = wrap_items(self._legend(), width, DIM)
        if tier.has_slots:
            room = max(1, height - 2 - len(legend))  # the heading and the traffic
            lines += slot_rows(self._cells(), width, room)
        lines.append(traffic)
        lines += legend
        lines = [fit(line, width) for line in lines]
        return Text("\n").join(lines[:height])
