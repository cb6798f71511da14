"""The mixture-of-experts panel's state: where the router sent each step's tokens.

A mixture-of-experts model tells, once per step, how many tokens each expert of each sparse
layer received (`ExpertLoads`). This panel keeps the latest step's counts and the counts summed
over every step seen, and the pure functions below read them as the view draws them: how
uneven a layer's load is (its busiest expert against the mean), and, with expert parallelism,
how many (token, expert) pairs each rank computed. Under expert parallelism a rank holds a
contiguous run of experts whole, so a popular expert keeps its rank busy while the others wait
for it at the layer's all-reduce; without it every rank holds a slice of every expert, and the
ranks' work is the same whatever the routing.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanovllm.events import Event, ExpertLoads

EXPERT_EVENTS = frozenset({ExpertLoads})


@dataclass(frozen=True)
class ExpertsState:
    """The latest step's loads and the loads summed over the steps seen (`totals[i][e]`: layer
    `latest.layers[i]`, expert e)."""

    latest: ExpertLoads | None = None
    totals: tuple[tuple[int, ...], ...] = ()
    num_steps: int = 0


def reduce_experts(state: ExpertsState, event: Event) -> ExpertsState:
    """The panel after `event` (an `ExpertLoads`; any other event leaves it as it is)."""
    if not isinstance(event, ExpertLoads):
        return state
    same_shape = state.latest is not None and state.latest.layers == event.layers
    if same_shape and all(len(t) == len(c) for t, c in zip(state.totals, event.counts)):
        totals = tuple(
            tuple(a + b for a, b in zip(total, counts))
            for total, counts in zip(state.totals, event.counts)
        )
        return ExpertsState(event, totals, state.num_steps + 1)
    return ExpertsState(event, event.counts, 1)


def num_routed_tokens(loads: ExpertLoads) -> int:
    """The tokens the step's forward pass routed (each counted `top_k` times in a layer)."""
    return sum(loads.counts[0]) // loads.top_k if loads.counts and loads.top_k else 0


def imbalance(counts: tuple[int, ...]) -> float:
    """A layer's busiest expert over the mean expert: 1.0 when every expert got as many tokens,
    `len(counts)` when one got them all; 0.0 when no token was routed."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else 0.0


def expert_ranks(loads: ExpertLoads) -> tuple[int, ...]:
    """The rank that holds each expert (all 0 without expert parallelism)."""
    num_experts = len(loads.counts[0]) if loads.counts else 0
    return loads.expert_ranks or (0,) * num_experts


def rank_loads(loads: ExpertLoads) -> tuple[int, ...]:
    """With expert parallelism, the (token, expert) pairs each rank computed this step, over
    every sparse layer (rank r: the counts of the experts it holds); () without."""
    if not loads.expert_ranks:
        return ()
    pairs = [0] * (max(loads.expert_ranks) + 1)
    for counts in loads.counts:
        for expert, n in enumerate(counts):
            pairs[loads.expert_ranks[expert]] += n
    return tuple(pairs)


def busiest(counts: tuple[tuple[int, ...], ...], layers: tuple[int, ...]) -> tuple[int, int]:
    """(layer, expert) of the largest count (the first such, in layer then expert order)."""
    best = max(
        ((n, -i, -e) for i, row in enumerate(counts) for e, n in enumerate(row)), default=None
    )
    if best is None:
        return (0, 0)
    return layers[-best[1]], -best[2]


def expert_words(loads: ExpertLoads) -> str:
    """The step's routing in a few words, for the story: its busiest expert."""
    if not loads.counts:
        return "experts: no sparse layer"
    layer, expert = busiest(loads.counts, loads.layers)
    counts = loads.counts[loads.layers.index(layer)]
    return (
        f"router: busiest L{layer} e{expert}, {counts[expert]} of {sum(counts)} "
        f"(×{imbalance(counts):.1f} the mean)"
    )
