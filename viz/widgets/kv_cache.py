"""Physical KV cache: every block, coloured by owner, and the free block queue in order.

Grid cells: `A` a block owned by request A, `A²` shared by two requests (prefix cache, ref count
2), `a` free but still holding A's cached prefix (a later request with the same prefix can take
it back), `·` free and empty.

Below the grid, the free block queue from head to tail, the way the engine keeps it: blocks
leave at the head (least recently freed first, so a cached prefix survives as long as
possible) and return at the tail; a prefix-cache hit pulls a block out of the middle. The last
step's moves are highlighted: left at the head, pulled from the middle, joined at the tail.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text
from textual.geometry import Size

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import BlockInfo, VizState, kv_figures
from nanovllm.viz.style import (
    CACHED,
    DIM,
    FREE,
    GONE,
    HEADING,
    NEW,
    PULLED,
    cached_free_style,
    owner_style,
    request_glyph,
    runs,
    superscript,
)
from nanovllm.viz.widgets.base import StateView

CELL = 3  # characters per block in the grid
PLAIN = Style()
UNKNOWN = Style(reverse=True)
ROW_LABEL = 5
QUEUE_LINES = 3  # at most, for the free queue


def grid_columns(num_blocks: int, width: int) -> int:
    """Blocks per grid row: as many as fit, rounded down to a multiple of 8 to read ids easily."""
    cols = max(1, (width - ROW_LABEL) // CELL)
    if cols >= 8:
        cols -= cols % 8
    return max(1, min(cols, num_blocks))


class KVCacheView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.blocks, state.free_queue, state.last_step, state.requests)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        n = self.state.num_blocks
        if not n:
            return 1
        rows = -(-n // grid_columns(n, width))
        return 1 + rows + len(self._free_queue(width))

    def _owner_index(self, request_id: str | None) -> int | None:
        info = self.state.requests.get(request_id) if request_id else None
        return info.index if info else None

    def _cell(self, block: BlockInfo) -> tuple[str, Style]:
        if block.ref_count > 0 and block.owners:
            index = self._owner_index(block.owners[0])
            glyph = request_glyph(index) if index is not None else "?"
            mark = superscript(block.ref_count) if block.ref_count > 1 else " "
            style = owner_style(index) if index is not None else UNKNOWN
            return f" {glyph}{mark}", style
        if block.cached:
            index = self._owner_index(block.last_owner)
            glyph = request_glyph(index).lower() if index is not None else "c"
            return f" {glyph} ", cached_free_style(index)
        return " · ", FREE

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        n = state.num_blocks
        if not n:
            return Text("waiting for the engine", DIM)
        fig = kv_figures(state)
        head = Text(f"{n} blocks × {state.block_size} · ", HEADING)
        head.append(f"used {fig.num_used_blocks} · free {fig.num_free_blocks} ")
        head.append(f"({fig.num_cached_free_blocks} cached) · shared {fig.num_shared_blocks}")
        head.truncate(width, overflow="ellipsis")
        lines = [head]

        queue_lines = self._free_queue(width)
        cols = grid_columns(n, width)
        rows = -(-n // cols)
        room = max(1, height - 1 - len(queue_lines))
        for r in range(min(rows, room)):
            line = Text(f"{r * cols:>{ROW_LABEL - 1}} ", DIM)
            line.append(
                runs(self._cell(state.blocks[b]) for b in range(r * cols, min(n, (r + 1) * cols)))
            )
            lines.append(line)
        if rows > room:
            lines[-1] = Text(f"… {n - (room - 1) * cols} more blocks (enlarge the terminal)", DIM)
        lines.extend(queue_lines)
        return Text("\n").join(lines[:height])

    def _free_queue(self, width: int) -> list[Text]:
        state, record = self.state, self.state.last_step
        returned = set(record.returned) if record else set()
        queue = state.free_queue
        text = Text(f"free queue ({len(queue)}): ", HEADING)
        text.append("head ▸ ", DIM)
        budget = QUEUE_LINES * width - len(text) - 8

        def item(block_id: int) -> Text:
            if block_id in returned:
                style = NEW
            elif state.blocks[block_id].cached:
                style = CACHED
            else:
                style = PLAIN
            return Text(str(block_id), style) + Text(" ")

        items = [item(b) for b in queue]
        if sum(len(t) for t in items) > budget:
            # Show both ends: the head (next out) and the tail (just freed).
            head_items, tail_items, used = [], [], 4
            i, j = 0, len(items) - 1
            while i <= j:
                if used + len(items[i]) > budget // 2 + budget % 2 and len(head_items) > 0:
                    break
                head_items.append(items[i])
                used += len(items[i])
                i += 1
            while j >= i and used + len(items[j]) <= budget:
                tail_items.insert(0, items[j])
                used += len(items[j])
                j -= 1
            items = head_items + [Text(f"…{j - i + 1}… ", DIM)] + tail_items
        for t in items:
            text.append(t)
        text.append("◂ tail", DIM)
        lines = list(text.wrap(self.app.console, width))[:QUEUE_LINES]

        moves = Text()
        if record is not None:
            moves.append(f"step {record.step}: ", DIM)
            for label, ids, style in (
                ("left at head", record.taken, GONE),
                ("pulled by prefix hit", record.pulled, PULLED),
                ("joined at tail", record.returned, NEW),
            ):
                if ids:
                    moves.append(f"{label} ", DIM)
                    moves.append(" ".join(map(str, ids[:12])), style)
                    moves.append(" … " if len(ids) > 12 else "  ")
            if not (record.taken or record.pulled or record.returned):
                moves.append("no block moved", DIM)
        moves.truncate(width)
        return lines + [moves]
