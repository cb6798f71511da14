"""The free block queue as a strip, from head to tail, the way the KV cache manager keeps it.

Blocks leave at the head (the least recently freed first) and return at the tail, so a freed
block keeps its cached prefix for as long as possible: it is only *evicted* (its prefix
forgotten) when it reaches the head and is handed out again. A block still holding a cached
prefix is drawn in the colour of the request that cached it; `▾` marks the next one to be
evicted (the cached block nearest the head). Moves of the step on screen: `←n` left at the head,
`↑n` a gap where a prefix hit pulled block n out of the middle, and blocks that just joined the
tail are green. When the queue is longer than the strip, its middle is elided.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text
from textual.geometry import Size

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import VizState, latest_changes
from nanovllm.viz.style import DIM, FLASH, GONE, HEADING, NEW, PULLED, cached_free_style, fit
from nanovllm.viz.widgets.base import StateView

PLAIN = Style(color="grey70")
NEXT_EVICTION = "▾"
MAX_LINES = 3  # of the strip, when the panel may grow


class FreeQueueView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.free_queue, state.blocks, state.draft, state.last_step)

    def _cells(self, width: int) -> list[tuple[str, Style]]:
        """One (text, style) per block of the queue, gaps and the blocks taken at the head."""
        state = self.state
        record = state.draft if state.draft.events else state.last_step
        changed = latest_changes(state).blocks
        digits = len(str(max(state.num_blocks - 1, 0)))
        cell = digits + 1
        gaps: dict[int | None, list[int]] = {}
        taken: tuple[int, ...] = ()
        returned: set[int] = set()
        if record is not None:
            taken, returned = record.taken, set(record.returned)
            queued = set(state.free_queue)
            anchors = dict((b, before) for before, b in record.gaps)
            for before, block_id in record.gaps:
                # The block before the gap may have left the queue since: the gap then sits
                # where *that* block was (its own gap), or at the head if it was taken.
                seen = set()
                while before is not None and before not in queued and before not in seen:
                    seen.add(before)
                    before = anchors.get(before)
                gaps.setdefault(before, []).append(block_id)
        next_evicted = next((b for b in state.free_queue if state.blocks[b].cached), None)
        cells: list[tuple[str, Style]] = []
        for block_id in taken:
            cells.append((f"←{block_id}".rjust(cell), FLASH if block_id in changed else GONE))
        cells.append(("▸", HEADING))
        for block_id in gaps.get(None, []):
            cells.append((f"↑{block_id}".rjust(cell), PULLED))
        for block_id in state.free_queue:
            block = state.blocks[block_id]
            if block_id in changed:
                style = FLASH
            elif block_id in returned:
                style = NEW
            elif block.cached:
                info = state.requests.get(block.cached_by or "")
                style = cached_free_style(info.slot if info else None)
            else:
                style = PLAIN
            mark = NEXT_EVICTION if block_id == next_evicted else " "
            cells.append((f"{mark}{block_id:>{digits}}", style))
            for pulled in gaps.get(block_id, []):
                cells.append((f"↑{pulled}".rjust(cell), PULLED))
        cells.append(("◂", HEADING))
        return cells

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The heading, the strip over at most `MAX_LINES` lines, the legend."""
        if not self.state.num_blocks or width < 1:
            return 1
        return 2 + len(_wrap(self._cells(width), width, MAX_LINES))

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        if width < 1 or height < 1:
            return Text()
        if not state.num_blocks:
            return Text("waiting for the engine", DIM)
        cached = sum(1 for b in state.free_queue if state.blocks[b].cached)
        head = Text(f"{len(state.free_queue)} free ({cached} cached) · head ▸ … ◂ tail", HEADING)
        legend = Text(
            f"{NEXT_EVICTION} next eviction · colour: whose prefix it caches · "
            "←n left at head · ↑n pulled by a hit · green: joined the tail",
            DIM,
        )
        room = height - 1 - (1 if height >= 3 else 0)  # the heading, and the legend if it fits
        cells = self._cells(width)
        rows = _wrap(cells, width, max(1, room))
        lines = [head] + rows
        if height >= 3:
            lines.append(legend)
        lines = [fit(line, width) for line in lines]
        return Text("\n").join(lines[:height])


def _size(cells: list[tuple[str, Style]]) -> int:
    return sum(len(text) + 1 for text, _ in cells)


def _elide(cells: list[tuple[str, Style]], budget: int) -> list[tuple[str, Style]]:
    """Cut `cells` to about `budget` characters, keeping the head (`▸` and the blocks after
    it, the next ones out) and the tail (just freed); the blocks taken at the head this step,
    drawn before `▸`, get at most a quarter. What is cut is counted in words, `…19 more…`, so
    the count never reads like a block id."""
    if _size(cells) <= budget or len(cells) <= 4:
        return cells
    head = next((i for i, (text, _) in enumerate(cells) if text == "▸"), 0)
    taken, queue = cells[:head], cells[head:]
    if _size(taken) > budget // 4:  # keep the blocks taken last (beside `▸`), count the others
        kept: list[tuple[str, Style]] = []
        while taken and _size(kept) + len(taken[-1][0]) + 1 <= budget // 4 - 9:
            kept.insert(0, taken.pop())
        taken = ([(f"←{len(taken)} more", DIM)] if taken else []) + kept
    room = budget - _size(taken)
    if _size(queue) <= room:
        return taken + queue
    marker_size = len(f"…{len(queue)} more…") + 1
    keep = room - marker_size
    front, back, used = [], [], 0
    i, j = 0, len(queue) - 1
    while i <= j and (i < 2 or used + len(queue[i][0]) + 1 <= keep // 2):
        front.append(queue[i])  # `▸` and the head block at least
        used += len(queue[i][0]) + 1
        i += 1
    while j >= i and used + len(queue[j][0]) + 1 <= keep:
        back.insert(0, queue[j])
        used += len(queue[j][0]) + 1
        j -= 1
    # Count the blocks cut out (not the `↑n` gaps among them).
    hidden = sum(1 for text, _ in queue[i : j + 1] if text.lstrip(NEXT_EVICTION + " ").isdigit())
    return taken + front + [(f"…{hidden} more…", DIM)] + back


def _wrap(cells: list[tuple[str, Style]], width: int, max_lines: int) -> list[Text]:
    """Lay the cells out over at most `max_lines` lines; elide the middle if they do not fit."""
    # Each line may end a cell short (cells never break), so leave a cell per line of slack.
    slack = max_lines * max((len(text) for text, _ in cells), default=0)
    cells = _elide(cells, max(width, width * max_lines - slack))
    lines: list[Text] = [Text()]
    for text, style in cells:
        line = lines[-1]
        if len(line) and len(line) + 1 + len(text) > width:
            lines.append(line := Text())
        if len(line):
            line.append(" ")
        line.append(text, style)
    return lines[:max_lines]
