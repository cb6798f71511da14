"""Which of the executor panel's facts fit a panel of W x H cells, and where a list is cut.

The executor panel (`widgets/executor.py`) has more to say than a small terminal holds: the
flat batch's columns, each request's query start, context length and block table, the
selected request's attention reads block by block, the logits rows. Nothing may vanish
silently and nothing may be cut inside a word or a number, so every list here is cut between
two of its items and says what it left out (`… 14 more blocks`), and the panel's lines are
shared out by priority: first one of every kind of fact (so each of the six flat inputs shows
at every size), then more of each.

Pure functions over numbers and strings: tests drive them without a screen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.cells import cell_len

from nanovllm.viz.words import count

Marker = Callable[[int], str]  # the words for `n` items left out


def more(noun: str, plural: str | None = None) -> Marker:
    """The marker for items left out: `… 14 more blocks` (`… 14 more` without a noun)."""
    if not noun:
        return lambda n: f"… {n} more"
    return lambda n: f"… {count(n, 'more ' + noun, plural and 'more ' + plural)}"


@dataclass(frozen=True)
class Wrapped:
    """A list laid out over lines: each line's item indices, and the marker ending the last
    line when items were left out ('' when all are shown)."""

    lines: tuple[tuple[int, ...], ...]
    marker: str = ""

    @property
    def shown(self) -> int:
        return sum(len(line) for line in self.lines)


def wrap_items(
    items: Sequence[str],
    width: int,
    max_lines: int,
    sep: str,
    marker: Marker,
    first: int = 0,
    indent: int = 2,
) -> Wrapped:
    """`items` joined by `sep` over at most `max_lines` lines of `width` cells, a line broken
    only between two items. The first line starts `first` cells in (its heading), the others
    `indent` cells in. When they do not all fit, the last line ends with `marker(n)` (after
    `sep`), `n` the items left out, and holds fewer items so that the marker fits too."""
    if max_lines < 1:
        return Wrapped(())
    lines: list[list[int]] = [[]]
    used = first
    for i, item in enumerate(items):
        size = cell_len(item)
        gap = cell_len(sep) if lines[-1] else 0
        if used + gap + size <= width:
            lines[-1].append(i)
            used += gap + size
            continue
        if len(lines) == max_lines:
            break
        # (a first line whose heading leaves no room for an item keeps the heading alone)
        lines.append([i])
        used = indent + size
        if used > width:  # an item longer than a line: left out, and counted
            lines[-1].pop()
            break
    if sum(map(len, lines)) == len(items):
        return Wrapped(tuple(tuple(line) for line in lines))
    # The marker goes after the last line's items: take items off its end until it fits.
    while True:
        last = lines[-1]
        start = first if len(lines) == 1 else indent
        used = start + sum(cell_len(items[i]) for i in last)
        used += cell_len(sep) * max(0, len(last) - 1) + (1 if last else 0)
        words = marker(len(items) - sum(map(len, lines)))
        if used + cell_len(words) <= width or not last:
            return Wrapped(tuple(tuple(line) for line in lines), words)
        last.pop()


def fit_list(items: Sequence[str], width: int, sep: str, marker: Marker) -> str:
    """`items` on one line of `width` cells, cut between two items with `marker` saying how
    many were left out."""
    wrapped = wrap_items(items, width, 1, sep, marker)
    shown = [items[i] for i in (wrapped.lines[0] if wrapped.lines else ())]
    text = sep.join(shown)
    if wrapped.marker:
        text = f"{text} {wrapped.marker}" if text else wrapped.marker
    return text


def first_fitting(variants: Sequence[str], width: int) -> str:
    """The first of `variants` (longest first) that fits `width` cells; else the last one."""
    for text in variants:
        if cell_len(text) <= width:
            return text
    return variants[-1]


# --- the flat batch's columns ------------------------------------------------------------------


def column_window(widths: Sequence[int], start: int, room: int) -> int:
    """The end (exclusive) of the columns shown from `start`: as many as fit `room` cells,
    and at least one."""
    used, end = 0, start
    while end < len(widths) and (used + widths[end] <= room or end == start):
        used += widths[end]
        end += 1
    return end


def page_before(widths: Sequence[int], start: int, room: int) -> int:
    """The start of the page that ends where the page starting at `start` begins (`[`)."""
    used, begin = 0, start
    while begin > 0 and (used + widths[begin - 1] <= room or begin == start):
        used += widths[begin - 1]
        begin -= 1
    return begin


def last_page(widths: Sequence[int], room: int) -> int:
    """The start of the last page: the most columns that end the batch and fit `room`."""
    return page_before(widths, len(widths), room)


def clamp_start(widths: Sequence[int], start: int, room: int) -> int:
    """`start` moved back, if need be, so the page from it is full (no empty room at the
    right while columns to the left are hidden)."""
    return max(0, min(start, last_page(widths, room)))


# --- sharing out the panel's lines ----------------------------------------------------------

TABLE_ROWS = 6  # row and request, token text, token id, position, slot, logits row


@dataclass(frozen=True)
class Plan:
    """How many lines each part of the panel gets (the rest of the height is left blank)."""

    legend: bool  # the requests' legend line (`per request: q@query start …`)
    requests: int  # request lines, the selected one first among them
    summary: bool  # `+N more requests` for the requests left out
    attention: int  # lines of the selected request's block reads
    heat: int  # lines under the reads for the attention heat row
    logits: bool  # the logits line

    @property
    def height(self) -> int:
        return (
            2  # the stages, the flat batch's title
            + TABLE_ROWS
            + self.legend
            + self.requests
            + self.summary
            + self.attention
            + self.heat
            + self.logits
        )


def plan_lines(height: int, num_requests: int, attention_lines: int, heat_lines: int = 0) -> Plan:
    """Share `height` lines: first one line of each kind of fact (the selected request, its
    first block reads, a line counting the requests not listed, the logits line, the heat
    row's weights), then a second line of reads, the rest of the heat row, the rest of the
    reads, the other requests, the legend.
    `attention_lines` and `heat_lines` are the lines those parts would need to show whole."""
    left = height - 2 - TABLE_ROWS
    requests = min(1, num_requests)
    attention = min(1, attention_lines)
    left -= requests + attention
    others = max(0, num_requests - requests)
    summary = others > 0
    left -= summary
    logits = left >= 1
    left -= logits
    heat = max(0, min(heat_lines, 1, left))  # the heat row's weights
    left -= heat
    second = max(0, min(attention_lines - attention, 1, left))  # the reads' second line
    attention += second
    left -= second
    more_heat = max(0, min(heat_lines - heat, left))  # its scores, running max and sum
    heat += more_heat
    left -= more_heat
    more_reads = max(0, min(attention_lines - attention, left))
    attention += more_reads
    left -= more_reads
    if others and left > 0:
        # Listing every other request frees the summary line; else list what fits beside it.
        listed = others if left + 1 >= others else left
        requests += listed
        left -= listed - (1 if listed == others else 0)
        summary = listed < others
    legend = num_requests > 0 and left >= 1
    return Plan(legend, requests, summary, attention, heat, logits)
