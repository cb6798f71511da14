"""Colours, glyphs and small text helpers shared by the views.

Every request gets a colour *and* a letter (from its arrival order), and every cell kind a
character as well as a style, so the views stay readable on a terminal without colour
(`NO_COLOR`, where Textual draws in monochrome): the letters and characters carry the meaning,
the colours only make it faster to see.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from itertools import groupby

from rich.cells import set_cell_size
from rich.style import Style
from rich.text import Text

from nanovllm.viz.state import CHUNK, DECODE, PREEMPTED, PREFILL, SPEC, WAIT, RequestInfo

COLORS: tuple[str, ...] = (
    "#e06c75",
    "#61afef",
    "#98c379",
    "#e5c07b",
    "#c678dd",
    "#56b6c2",
    "#d19a66",
    "#ff79c6",
    "#7ec699",
    "#a9a1e1",
    "#f08d49",
    "#8be9fd",
)
# A request's letter: Latin, then Greek capitals unlike any Latin one (their lower case marks
# a cached-free block too). `state.py` gives a new request a letter no live request holds.
GLYPHS = "ABCDEFGHIJKLMNOPQRSTUVWXYZΓΔΘΛΞΠΣΦΨΩ"

DIM = Style(color="grey50")
FREE = Style(color="grey42")
CACHED = Style(color="grey85", bgcolor="grey30")
HEADING = Style(bold=True)
SELECTED = Style(reverse=True)
NEW = Style(color="black", bgcolor="#98c379", bold=True)  # just returned to the free queue
GONE = Style(color="black", bgcolor="#e5c07b", bold=True)  # just left the free queue
PULLED = Style(color="black", bgcolor="#c678dd", bold=True)  # pulled out by a prefix hit
ALERT = Style(color="white", bgcolor="red", bold=True)
FLASH = Style(color="black", bgcolor="white", bold=True)  # what the latest move changed
MARK = Style(bold=True, underline=True)  # the selected request's blocks
PROPOSED = Style(color="black", bgcolor="#e5c07b")  # a proposed token's slot, not verified yet


def escape_token(text: str) -> str:
    """A token's text with whitespace made visible (` ` -> `␣`, newline -> `⏎`, tab -> `⇥`) and
    every other unprintable character escaped as Python writes it (`\\x07`)."""
    shown = text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in shown
    )


def token_cell(text: str, width: int) -> str:
    """A token's escaped text (`escape_token`) in `width` cells: cut, or padded."""
    return set_cell_size(escape_token(text), width)


SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"


def request_color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def request_glyph(index: int) -> str:
    return GLYPHS[index % len(GLYPHS)]


# Styles are cached so that equal styles are the same object: `runs` can then merge
# neighbouring cells cheaply, and Textual converts fewer distinct styles per frame.


@lru_cache(maxsize=256)
def owner_style(index: int) -> Style:
    """Background in the request's colour: blocks and batch segments it owns."""
    return Style(color="black", bgcolor=request_color(index), bold=True)


@lru_cache(maxsize=256)
def text_style(index: int) -> Style:
    return Style(color=request_color(index), bold=True)


@lru_cache(maxsize=256)
def cached_free_style(index: int | None) -> Style:
    """A free block that still holds request `index`'s cached prefix."""
    return Style(color=request_color(index) if index is not None else "grey85", bgcolor="grey23")


def runs(cells: Iterable[tuple[str, Style]]) -> Text:
    """Text from (characters, style) cells, one span per run of equal styles.

    A frame's cost grows with the number of styled spans (Textual converts each one), and
    rows of the timeline or the block grid are mostly long runs: merging them keeps the
    frame rate up on a big terminal.
    """
    text = Text()
    for style, group in groupby(cells, key=lambda cell: cell[1]):
        text.append("".join(chars for chars, _ in group), style)
    return text


ITEM_SEPARATORS = (" · ", " │ ", "; ", ", ")  # where `fit` cuts, else between two words


def fit(text: Text, width: int) -> Text:
    """`text` cut to `width` cells between two items (` · `, ` │ `, `; `, `, `) or two words,
    never inside a word: a label cut mid-word reads as another word (`decod…`). What is cut
    is left out whole; only a first word longer than `width` is cut (`…` ending it)."""
    if text.cell_len <= width:
        return text
    plain = text.plain
    for seps in (ITEM_SEPARATORS, (" ",)):
        cut = max(plain.rfind(sep, 0, width + 1) for sep in seps)  # the last one that fits
        if cut > 0:
            out = text[:cut]
            out.rstrip()
            if out.plain.endswith((" ·", " │")):  # a legend's `·` item, say: not half of one
                out.right_crop(2)
            return out
    out = text.copy()
    out.truncate(width, overflow="ellipsis")
    return out


def wrap_items(items: list[str], width: int, style: Style | str = "") -> list[Text]:
    """`items` joined by ` · ` over as many lines as they need, never one split across two."""
    lines: list[Text] = []
    line = ""
    for item in items:
        if line and len(line) + 3 + len(item) > width:
            lines.append(Text(line, style))
            line = ""
        line = f"{line} · {item}" if line else item
    if line:
        lines.append(Text(line, style))
    return lines


def fit_plain(text: str, width: int) -> str:
    """`fit` for a plain string (a border's title)."""
    return fit(Text(text), width).plain


MAX_ID = 16  # characters of a request id in a label without a set width


def short_id(request_id: str, room: int) -> str:
    """`request_id` in at most `room` characters: whole, or its start and its last two
    characters around `…` (a server's ids, `cmpl-9f8e…-0`, differ at both ends)."""
    if len(request_id) <= room:
        return request_id
    if room >= 6:
        return request_id[: room - 3] + "…" + request_id[-2:]
    return request_id[: max(0, room - 1)] + "…"


def request_label(info: RequestInfo | None, request_id: str, width: int = 0) -> Text:
    """`A r12`: the request's letter on its colour, then its id, padded to `width` (a long id
    is shortened, `short_id`, to leave a space after it)."""
    text = Text()
    if info is None:
        text.append("?", DIM)
    else:
        text.append(request_glyph(info.slot), owner_style(info.slot))
    text.append(" ")
    shown = short_id(request_id, width - 3 if width else MAX_ID)
    text.append(shown, text_style(info.slot) if info else DIM)
    if width:
        text.truncate(width, pad=True)
    return text


def superscript(n: int) -> str:
    return "⁺" if n > 9 else SUPERSCRIPTS[n]


# One timeline cell: a character that reads without colour, and a style.
CELL_CHARS = {PREFILL: "P", CHUNK: "p", DECODE: "=", SPEC: "≡", PREEMPTED: "X", WAIT: "·"}


@lru_cache(maxsize=1024)
def cell_style(kind: str, index: int) -> Style:
    if kind == PREFILL:
        return owner_style(index)
    if kind == CHUNK:
        return Style(color="black", bgcolor=request_color(index), dim=True)
    if kind in (DECODE, SPEC):
        return text_style(index)
    if kind == PREEMPTED:
        return ALERT
    return DIM


def bar(fraction: float, width: int, style: Style | str = "") -> Text:
    """A horizontal gauge of `width` cells."""
    fraction = max(0.0, min(1.0, fraction))
    full = round(fraction * width)
    text = Text("█" * full, style=style)
    text.append("░" * (width - full), DIM)
    return text


def seconds(value: float) -> str:
    """A duration in the unit that reads best."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def rank_times(times: tuple[float, ...]) -> str:
    """Per-rank durations, compactly: "3.1 / 2.9 ms" (in rank order) for up to 4 ranks, the
    range "2.9-3.4 ms" for more."""
    if not times:
        return ""
    ms = [t * 1e3 for t in times]
    if len(ms) <= 4:
        return " / ".join(f"{t:.1f}" for t in ms) + " ms"
    return f"{min(ms):.1f}-{max(ms):.1f} ms"
