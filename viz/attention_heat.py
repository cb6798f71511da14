"""Attention from the inside, as the executor panel draws it: one head's walk over the blocks.

The engine's attention probe (`nanovllm/executor/attention_probe.py`) sends, for the request the
learner selected and one layer, an `AttentionProbed` event: per query head, each context token's
score q·k, the online softmax's running max and running sum after each block it reads, and the
final weights. This module cuts that event into what the heat row shows, one `HeatColumn` a
block in block-table order, and says in words why there is nothing to show when there is not
(a trace recorded without the probe, a request the probe was not following, a step before the
probe started). It computes nothing from the numbers but their shading levels: every figure is
the event's.

Pure functions over frozen data; `widgets/attention_heat.py` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanovllm.events import AttentionProbed

SCORE_BARS = "▁▂▃▄▅▆▇█"  # a score, low to high within the head's row
WEIGHT_SHADES = "·░▒▓█"  # a weight, from (about) none to the largest of the row


@dataclass(frozen=True)
class HeatColumn:
    """One block of the request's context, as attention read it."""

    logical: int  # its index in the block table
    block: int  # the physical block
    scores: tuple[float, ...]  # q·k × scale of its tokens (1 to block_size of them)
    weights: tuple[float, ...]  # their final softmax weights
    running_max: float  # m after this block
    running_sum: float  # l after this block (relative to that m)


def heat_columns(probe: AttentionProbed, head: int) -> list[HeatColumn]:
    """Head `head`'s walk (modulo the heads there are), one column a block read."""
    h = head % len(probe.scores)
    size = probe.block_size
    return [
        HeatColumn(
            logical=i,
            block=block,
            scores=probe.scores[h][i * size : (i + 1) * size],
            weights=probe.weights[h][i * size : (i + 1) * size],
            running_max=probe.running_max[h][i],
            running_sum=probe.running_sum[h][i],
        )
        for i, block in enumerate(probe.block_table)
    ]


def score_level(score: float, low: float, high: float) -> int:
    """0 .. len(SCORE_BARS) - 1: where `score` falls between the row's lowest and highest."""
    if high <= low:
        return len(SCORE_BARS) - 1
    return round((score - low) / (high - low) * (len(SCORE_BARS) - 1))


def weight_level(weight: float, largest: float) -> int:
    """0 .. len(WEIGHT_SHADES) - 1: a shade for each factor of 4 below the row's largest weight
    (`█` at least half of it, `▓` an eighth, `▒` 1/32, `░` 1/128, `·` less): weights span
    orders of magnitude, and a linear scale would show only the largest."""
    if largest <= 0 or weight <= 0:
        return 0
    level = len(WEIGHT_SHADES) - 1
    bound = largest / 2
    while level > 0 and weight < bound:
        level -= 1
        bound /= 4
    return level


def short_number(x: float) -> str:
    """At most 5 characters for |x| < 1000 (`2.31`, `-12.3`, `123`)."""
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def next_layer(layer: int, num_layers: int) -> int:
    """The layer after `layer` for the probe, numbered as vLLM numbers them (0 to
    num_layers - 1, then 0 again; 0 while the number of layers is not known)."""
    return (layer + 1) % num_layers if num_layers > 0 else 0


def probe_for(probe: AttentionProbed | None, request_id: str, step: int) -> AttentionProbed | None:
    """The probe's catch for this request at this step, if the latest one is that."""
    if probe is not None and probe.request_id == request_id and probe.step == step:
        return probe
    return None


def why_none(probe: AttentionProbed | None, request_id: str, step: int, mode: str) -> str:
    """Why step `step` shows no attention from the inside for `request_id`, in words.

    `mode` is the driver's: "live" runs the probe while the executor panel is open; "replay"
    shows what a trace recorded; "connect" reads a server, whose stream has no probe."""
    if mode == "connect":
        return "a server's event stream has no attention probe (a live `nanovllm viz` run has)"
    if mode == "replay":
        if probe is None:
            return (
                "this trace has no attention probe: it is recorded only while the executor "
                "panel is open in a live run"
            )
        return (
            f"not in this trace for {request_id} at step {step}: the probe followed the "
            "selected request while the executor panel was open"
        )
    if probe is not None and probe.step == step:
        return (
            f"captured for {probe.request_id}, not {request_id}: select it to follow it from "
            "the next step"
        )
    return "captured from the next step on: the probe follows the selected request"
