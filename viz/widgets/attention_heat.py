"""The heat row: what one head of attention computed for the selected request, block by block.

Drawn under the executor panel's block reads (`widgets/executor.py` calls `attention_heat`),
one column a block of the request's block table, in the order attention reads them:

    layer 0   │#3      │#7      │#9
    h1/4 q·k  │▁▂▅█▃▂▁▁│▂▃▁▁▂▃▅▂│▂▃▁        each token's score q·k × scale, low to high
    max       │2.31    │2.31    │2.50      the online softmax's running max after the block
    sum       │4.10    │7.25    │9.80      its running sum of exp(score - max) after the block
    weights   │░▒▓█░░░░│░░░▒▓░░░│░█▓       the final weights that combine the values (a shade
                                            for each factor of 4 below the largest)

With fewer lines it keeps the weights first, then the scores, then max and sum (on one line),
then the block ids; with six, a title line first (layer, head, its KV head, the query's
position, the scale). Blocks that do not fit are counted, at the line's end (`2 more▸`) and at
its start (`◂3`): the window keeps the block being read on screen, or else the block with the
largest weight. While the panel plays the attention stage, the walk is replayed: the block
being read is marked and the blocks after it are still blank; the weights appear once the last
block is read. `h` cycles the heads, `l` the layers (numbered as vLLM numbers them, from 0;
with fewer than five lines the weights' line names it after them, `layers.2`, where it fits): the
app asks the engine to probe that layer from the next step on (`ProbeAttention`).

Every number is the engine's (`AttentionProbed`, from the forward pass's own query and keys).
"""

from __future__ import annotations

from textwrap import wrap

from rich.style import Style
from rich.text import Text

from nanovllm.events import AttentionProbed
from nanovllm.viz.attention_heat import (
    SCORE_BARS,
    WEIGHT_SHADES,
    HeatColumn,
    heat_columns,
    probe_for,
    score_level,
    short_number,
    weight_level,
    why_none,
)
from nanovllm.viz.style import DIM, HEADING, fit

LABEL = 10  # the row labels' column
MAX_LINES = 6  # title, block ids, scores, max, sum, weights
SCORE = Style(color="#61afef")
READING = Style(color="black", bgcolor="#e5c07b", bold=True)  # the block being read (as the reads)
SHADE_STYLES = (
    DIM,
    Style(color="#8a6d3b"),
    Style(color="#b8923f"),
    Style(color="#e5c07b", bold=True),
    Style(color="#ffd75f", bold=True),
)


def attention_heat(
    latest: AttentionProbed | None,
    request_id: str,
    step: int,
    mode: str,
    head: int,
    width: int,
    room: int,
    hop: int | None = None,
    attention_ran: bool = True,
) -> list[Text]:
    """At most `room` lines of at most `width` cells: the heat row of `request_id` at `step`
    (`latest` is the state's latest probe), or why there is none. `hop`: the attention cursor's
    count while the attention stage plays (None: the walk is over); `attention_ran`: the step
    has reached its attention stage (the probe's event comes just before it)."""
    if room <= 0 or width < 20:
        return []
    if not attention_ran:
        return note_lines(
            f"step {step} has not reached its attention stage yet", width, min(room, 2)
        )
    probe = probe_for(latest, request_id, step)
    if probe is None:
        return note_lines(why_none(latest, request_id, step, mode), width, min(room, 2))
    reading = hop % len(probe.block_table) if hop is not None else None
    return heat_lines(probe, head, width, room, reading)


def note_lines(text: str, width: int, room: int) -> list[Text]:
    """`text` after a heading, wrapped between words over at most `room` lines (`…` ends the
    last when it is cut)."""
    heading = "attention inside: "
    lines = wrap(heading + text, width - 1) or [""]
    if len(lines) > room:
        lines = lines[:room]
        lines[-1] = fit(Text(lines[-1]), width - 2).plain + " …"
    out = [Text(line, DIM) for line in lines]
    out[0].stylize(HEADING, 0, len(heading) - 1)
    return out


def heat_lines(
    probe: AttentionProbed, head: int, width: int, room: int, reading: int | None = None
) -> list[Text]:
    """The heat row of head `head`, on `min(room, MAX_LINES)` lines (see the module docstring)."""
    h = head % len(probe.scores)
    columns = heat_columns(probe, h)
    rows = _rows(min(room, MAX_LINES))
    numbers = [
        (short_number(c.running_max), short_number(c.running_sum)) for c in columns
    ]  # fmt: skip
    widths = []
    for c, (m, s) in zip(columns, numbers):
        w = len(c.scores)
        if "stats" in rows:
            w = max(w, len(m) + 1 + len(s))
        elif "max" in rows:
            w = max(w, len(m), len(s))
        if "ids" in rows:
            w = max(w, len(f"#{c.block}"))
        widths.append(w + 1)  # + the separator before it
    # On screen: the block being read, or else the one holding the largest weight.
    top = max(range(probe.seq_len), key=probe.weights[h].__getitem__)
    anchor = reading if reading is not None else top // probe.block_size
    first, last = _window(widths, width - LABEL, anchor)
    if last <= first:  # not even one block fits beside the labels
        return note_lines(f"a block needs {widths[0] + LABEL} columns here", width, 1)
    left = f"◂{first} " if first else ""
    right = f" {len(columns) - last} more▸" if last < len(columns) else ""
    shown = range(first, last)
    done = reading is None or reading == len(columns) - 1
    scores = probe.scores[h]
    low, high = min(scores), max(scores)
    largest = max(probe.weights[h])
    group = len(probe.scores) // probe.num_kv_heads
    lines: list[Text] = []
    for row in rows:
        if row == "title":
            text = (
                f"inside layer {probe.layer}'s attention: head {h} of {len(probe.scores)} "
                f"(KV head {h // group}) · query at position {probe.seq_len - 1} · "
                f"q·k × {probe.scale:.3g} · h: next head · l: next layer"
            )
            lines.append(fit(Text(text, HEADING), width))
            continue
        label = {
            "ids": f"layer {probe.layer}",
            "scores": f"h{h}/{len(probe.scores)} q·k",
            "stats": "max sum",
            "max": "max",
            "sum": "sum",
            "weights": "weights",
        }[row]
        first_row = all(line.plain.startswith("inside") for line in lines)  # markers go there
        line = Text(label.ljust(LABEL), DIM)
        if row == "weights" and not done:
            lines.append(line.append("once attention has read the last block", DIM))
            continue
        line.append(left if first_row else " " * len(left), DIM)
        for i in shown:
            now = i == reading
            cell = _cell(row, columns[i], *numbers[i], reading is not None and i > reading,
                         done, low, high, largest)  # fmt: skip
            if now and row != "scores" and row != "weights":
                cell.stylize(READING)
            line.append("│", READING if now else DIM)
            line.append(cell)
            line.append(" " * (widths[i] - 1 - cell.cell_len))
        line.rstrip()
        if first_row:
            line.append(right, DIM)
        if row == "weights":  # the largest weight, where it fits (and the layer, unnamed above)
            named = "" if {"title", "ids"} & set(rows) else f"  layers.{probe.layer} ·"
            words = f"{named}  top {probe.weights[h][top]:.2f} at position {top}"
            for text in (words, named.removesuffix(" ·")):
                if line.cell_len + len(text) <= width:
                    line.append(text, DIM)
                    break
        lines.append(line)
    return lines


def _rows(n: int) -> list[str]:
    """Which lines `n` lines hold, top to bottom."""
    if n >= 6:
        return ["title", "ids", "scores", "max", "sum", "weights"]
    return [
        ["weights"],
        ["scores", "weights"],
        ["scores", "stats", "weights"],
        ["scores", "max", "sum", "weights"],
        ["ids", "scores", "max", "sum", "weights"],
    ][n - 1]


def _window(widths: list[int], room: int, anchor: int) -> tuple[int, int]:
    """The blocks [first, last) shown in `room` cells: from the first, or ending at block
    `anchor` when it would not be on screen; markers' room kept when some are left out."""
    n = len(widths)
    if sum(widths) <= room:
        return 0, n
    room -= len(f"◂{n} ") + len(f" {n} more▸")
    first = 0
    while first < anchor and sum(widths[first : anchor + 1]) > room:
        first += 1
    last = first
    while last < n and sum(widths[first : last + 1]) <= room:
        last += 1
    return first, last


def _cell(
    row: str,
    c: HeatColumn,
    m: str,
    s: str,
    unread: bool,
    done: bool,
    low: float,
    high: float,
    largest: float,
) -> Text:
    """What column `c` shows on line `row` (blank while attention has not read it yet)."""
    if row == "ids":
        return Text(f"#{c.block}")
    if unread:
        return Text("")
    if row == "scores":
        return Text("".join(SCORE_BARS[score_level(x, low, high)] for x in c.scores), SCORE)
    if row == "max":
        return Text(m)
    if row == "sum":
        return Text(s)
    if row == "stats":
        return Text(f"{m} {s}")
    if not done:  # the weights: only once the walk is over
        return Text("")
    cell = Text()
    for x in c.weights:
        level = weight_level(x, largest)
        cell.append(WEIGHT_SHADES[level], SHADE_STYLES[level])
    return cell
