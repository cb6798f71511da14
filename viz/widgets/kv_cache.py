"""Physical KV cache: every block of the paged cache, coloured by the request that owns it.

Cells: `A` a block owned by request A, `A²` shared by two requests (prefix cache, ref count
2), `a` free but still holding A's cached prefix (a later request with the same prefix can take
it back), `#` the same for a prefix cached before the viewer joined (`--connect`: the snapshot
names no request), `·` free and empty, `∅` the null block (a model with sliding-window layers:
it stands in a sliding group's block tables for the blocks the window passed, never holds KV
and never joins the free queue). The selected request's blocks are underlined (`›` in front when
cells are small), and what the latest move changed is drawn in white.

The grid grows with the panel: on a big terminal each block is a box with its id, every
owner's letter and the start of its prefix-cache hash (`#3738…`); on a small one a block is
three characters and the block id of each row stands at its left. The free block queue has its own view (`free_queue.py`).
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text
from textual.geometry import Size

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import BlockInfo, VizState, kv_figures, latest_changes
from nanovllm.viz.style import (
    DIM,
    FLASH,
    FREE,
    HEADING,
    MARK,
    cached_free_style,
    fit,
    owner_style,
    request_glyph,
    runs,
    superscript,
)
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.words import count

UNKNOWN = Style(reverse=True)
UNKNOWN_CACHED = "#"  # a cached-free block whose request the events never named
ROW_LABEL = 5
# Cell shapes, biggest first: (characters per block, lines per block). 15 characters hold a
# block's whole hash (`#` and 12 hex digits); the one-line shapes are for small panels, the
# last one when even three characters a block would not fit the panel's height.
SHAPES = ((15, 3), (12, 3), (10, 3), (8, 2), (6, 2), (5, 2), (3, 1), (2, 1))
SMALL_SHAPES = SHAPES[-2:]


def grid_columns(num_blocks: int, width: int, cell: int = 3, lines: int = 1) -> int:
    """Blocks per grid row: as many as fit. One-line cells round down to a multiple of 4 (each
    row's first block id stands at its left, so ids read off easily); big cells show their own
    ids and take every column."""
    cols = max(1, (width - ROW_LABEL) // cell)
    if lines == 1 and cols >= 8:
        cols -= cols % 4
    return max(1, min(cols, num_blocks))


def grid_shape(
    num_blocks: int, width: int, height: int, big: bool = True
) -> tuple[int, int, int, int]:
    """(cell width, cell lines, columns, rows): the biggest cells whose grid fits."""
    shapes = SHAPES if big else SMALL_SHAPES
    for cell, lines in shapes:
        cols = grid_columns(num_blocks, width, cell, lines)
        rows = -(-num_blocks // cols)
        # Big cells only when the grid stays at least 8 blocks wide; every shape but the
        # smallest only when the grid fits the height.
        wide_enough = lines == 1 or cols >= min(num_blocks, 8)
        if (cell, lines) == shapes[-1] or (wide_enough and rows * lines <= height):
            return cell, lines, cols, rows
    raise AssertionError("unreachable")


class KVCacheView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.blocks, state.requests, state.draft, state.last_step)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The heading and the grid, with the biggest cells that fit half the column."""
        n = self.state.num_blocks
        if not n or width < 1:
            return 1
        # Within the panel's `max-height` (app.tcss), less its borders and heading.
        share = 0.34 if self._medium_short() else 0.5
        cap = max(1, int(container.height * share) - 3)
        _, lines, _, rows = grid_shape(n, width, cap, big=self._big_cells())
        return 1 + rows * lines

    def _medium_short(self) -> bool:
        """Whether the grid gets a third of the column (app.tcss): from 100 columns below 40
        rows, or beside the executor panel below 30 rows."""
        screen = self.screen if self.is_mounted else None
        if screen is None:
            return False
        medium = screen.has_class("-medium") and not screen.has_class("-tall")
        return medium or (screen.has_class("-executor") and screen.has_class("-short"))

    def _big_cells(self) -> bool:
        """Two-line cells only on a tall terminal: a short one needs the lines elsewhere."""
        return self.is_mounted and self.screen.has_class("-tall")

    def _owner_index(self, request_id: str | None) -> int | None:
        info = self.state.requests.get(request_id) if request_id else None
        return info.slot if info else None

    def _cell(self, block_id: int, block: BlockInfo, cell: int, lines: int) -> list[tuple]:
        """The block's cell: one (characters, style) per line."""
        if block.ref_count > 0 and block.owners:
            indices = [self._owner_index(r) for r in block.owners]
            first = indices[0]
            style = owner_style(first) if first is not None else UNKNOWN
            glyphs = "".join(request_glyph(i) if i is not None else "?" for i in indices)
        elif block.cached:
            first = self._owner_index(block.cached_by or block.last_owner)
            style = cached_free_style(first)
            # Whose prefix it is may be unknown (joined by a snapshot): `#`, never a letter.
            glyphs = request_glyph(first).lower() if first is not None else UNKNOWN_CACHED
        elif block_id == self.state.null_block:
            style, glyphs = DIM, "∅"
        else:
            style, glyphs = FREE, "·"
        mark = superscript(block.ref_count) if block.ref_count > 1 else ""
        selected = self.selected is not None and self.selected in block.owners
        if block_id in self._changed:
            style = FLASH
        elif selected:
            style = style + MARK
        if lines == 1:
            body = glyphs[0] + (mark or " ")
            if cell == 2:  # no room for `›`: the underline alone marks the selection
                return [(body, style)]
            return [(("›" if selected else " ") + body, style)]
        room = cell - 2
        owners = glyphs if len(glyphs) + len(mark) <= room else glyphs[: room - 2] + "…"
        top = f" {block_id}".ljust(cell - 1)[: cell - 1]
        middle = f" {owners}{mark}".ljust(cell - 1)[: cell - 1]
        if lines == 2:
            return [(top, style), (middle, style)]
        bottom = f" #{block.block_hash}" if block.block_hash else ""
        return [(top, style), (middle, style), (bottom.ljust(cell - 1)[: cell - 1], style)]

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        n = state.num_blocks
        if width < 1 or height < 1:
            return Text()
        if not n:
            return Text("waiting for the engine", DIM)
        self._changed = latest_changes(state).blocks
        fig = kv_figures(state)
        head = Text(f"{n} blocks × {state.block_size} · ", HEADING)
        head.append(f"used {fig.num_used_blocks} · free {fig.num_free_blocks} ")
        head.append(f"({fig.num_cached_free_blocks} cached) · shared {fig.num_shared_blocks}")
        head = fit(head, width)
        lines = [head]
        cell, cell_lines, cols, rows = grid_shape(n, width, height - 1, big=self._big_cells())
        room = max(1, (height - 1) // cell_lines)
        gap = (" ", Style()) if cell_lines > 1 else None
        for r in range(min(rows, room)):
            ids = range(r * cols, min(n, (r + 1) * cols))
            cells = [self._cell(b, state.blocks[b], cell, cell_lines) for b in ids]
            for line_no in range(cell_lines):
                # Small cells: each row's first block id at its left (big cells show ids).
                first = f"{r * cols:>{ROW_LABEL - 1}} " if cell_lines == 1 else ""
                label = first.ljust(ROW_LABEL) if line_no == 0 else " " * ROW_LABEL
                line = Text(label, DIM)
                parts = []
                for c in cells:
                    parts.append(c[line_no])
                    if gap is not None:
                        parts.append(gap)
                line.append(runs(parts))
                lines.append(line)
        if rows > room:
            shown = (room - 1) * cols
            lines = lines[: 1 + (room - 1) * cell_lines]
            lines.append(Text(f"… {count(n - shown, 'more block')} (enlarge the terminal)", DIM))
        return Text("\n").join(lines[:height])

    _changed: frozenset[int] = frozenset()
