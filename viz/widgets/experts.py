"""Experts: where a mixture of experts' router sent the step's tokens, layer by layer.

Shown only for a model with mixture-of-experts layers (`app.py` marks the screen `-moe` once an
`ExpertLoads` event arrives). One row per sparse layer, one column per expert: how many tokens
the expert received this step, shaded by its share of the layer's busiest expert (bright: the
busiest; `·`: none), then `×2.4`, the busiest expert's count over the mean expert's (1.0: an
even load). When the numbers do not fit, each expert is one shade (`█▓▒░·`). With expert
parallelism the columns are grouped by the rank that holds them (`│` between ranks), and a line
counts the (token, expert) pairs each rank computed: the layer's all-reduce waits for the
busiest. The last line sums every step seen: the expert that took the most tokens so far, and its
share of its layer's tokens against an even share.

    step 12 · 40 tokens, each to 2 of 8 experts
        e0 e1 e2 e3 e4 e5 e6 e7
    L0   3 12  ·  9  5  1  4 46 ×4.6
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text
from textual.geometry import Size

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.experts import (
    busiest,
    expert_ranks,
    imbalance,
    num_routed_tokens,
    rank_loads,
)
from nanovllm.viz.state import VizState
from nanovllm.viz.style import DIM, HEADING, fit
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.words import count

SHADES = "·░▒▓█"  # none, then a quarter of the busiest's count or less, ..., the busiest
HEAT = (
    Style(color="grey42"),
    Style(color="#61afef"),
    Style(color="#98c379"),
    Style(color="#e5c07b", bold=True),
    Style(color="#e06c75", bold=True),
)


def heat(n: int, top: int) -> int:
    """The shade of a count against the layer's largest: 0 for none, 1-4 by quarters."""
    if n <= 0 or top <= 0:
        return 0
    return min(4, 1 + (4 * n - 1) // top)


class ExpertsView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.experts,)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(expert_lines(self.state, width, 1000)) if width > 0 else 1

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        if width < 1 or height < 1:
            return Text()
        return Text("\n").join(expert_lines(self.state, width, height))


def expert_lines(state: VizState, width: int, height: int) -> list[Text]:
    """The panel's lines (see the module docstring), at most `height` of them: the step's line,
    the column heads, as many layers as fit (`… 2 more layers`), then the ranks' and the steps'
    sums when rows are left."""
    panel = state.experts
    loads = panel.latest
    if loads is None:
        return [Text("no mixture-of-experts layer has run yet", DIM)]
    num_experts = len(loads.counts[0]) if loads.counts else 0
    ranks = expert_ranks(loads)
    label = len(f"L{max(loads.layers, default=0)} ")
    top = max((max(c) for c in loads.counts), default=0)
    cell = max(len(str(top)), len(f"e{num_experts - 1}")) + 1
    gaps = len(set(ranks)) - 1  # a `│` between two ranks' runs
    numbers = label + num_experts * cell + 2 * gaps + 5 <= width
    head = Text(
        f"step {loads.step} · {count(num_routed_tokens(loads), 'token')}, each to "
        f"{loads.top_k} of {num_experts} experts",
        HEADING,
    )
    lines = [fit(head, width)]
    if numbers:
        if loads.expert_ranks:
            lines.append(_rank_heads(ranks, label, cell))
        heads = Text(" " * label)
        for e in range(num_experts):
            if e and ranks[e] != ranks[e - 1]:
                heads.append(" │")
            heads.append(f"e{e}".rjust(cell), DIM)
        lines.append(heads)
    rows = []
    for layer, counts in zip(loads.layers, loads.counts):
        row = Text(f"L{layer}".ljust(label), HEADING)
        top_here = max(counts, default=0)
        for e, n in enumerate(counts):
            if e and ranks[e] != ranks[e - 1]:
                row.append(" │" if numbers else "│")
            shade = heat(n, top_here)
            text = (str(n) if n else "·").rjust(cell) if numbers else SHADES[shade]
            row.append(text, HEAT[shade])
        row.append(f" ×{imbalance(counts):.1f}", DIM)
        rows.append(fit(row, width))
    extra = []
    pairs = rank_loads(loads)
    if pairs:
        extra.append(
            Text("pairs per rank: " + " · ".join(f"r{r} {n}" for r, n in enumerate(pairs)), DIM)
        )
    layer, expert = busiest(panel.totals, loads.layers)
    total = panel.totals[loads.layers.index(layer)]
    share = total[expert] / sum(total) if sum(total) else 0.0
    extra.append(
        Text(
            f"so far, {count(panel.num_steps, 'step')}: L{layer} e{expert} took {share:.0%} of "
            f"L{layer}'s tokens · even: {1 / max(num_experts, 1):.0%}",
            DIM,
        )
    )
    if height - len(lines) < 2:  # (no room for a row and the count: the column heads go)
        lines = lines[:1]
    room = height - len(lines)
    if len(rows) > room:
        kept = max(0, room - 1)
        lines += rows[:kept]
        lines.append(Text(f"… {count(len(rows) - kept, 'more layer')}", DIM))
    else:
        lines += rows
        lines += extra[: room - len(rows)]
    return [fit(line, width) for line in lines[:height]]


def _rank_heads(ranks: tuple[int, ...], label: int, cell: int) -> Text:
    """`rank 0` over the first of each rank's run of columns."""
    line = Text(" " * label)
    start = 0
    for e in range(1, len(ranks) + 1):
        if e == len(ranks) or ranks[e] != ranks[e - 1]:
            if start:
                line.append(" │", DIM)
            run = (e - start) * cell
            line.append(f"rank {ranks[start]}".center(run)[:run], DIM)
            start = e
    return line
