"""Parallel sampling as the visualizer sees it: which requests are children of one parent.

With `SamplingParams(n=k)` the engine fans a request out into k child requests named
f"{i}_{parent}" (vLLM's naming, `nanovllm/engine/parallel_sampling.py`) and queues them one
after the other, so their `RequestAdded` events arrive in a row: `0_p`, `1_p`, ... `k-1_p`.
The events carry no parent field, so the family is read from that pattern: a request named
`i_p` (i >= 1) joins the family of `p` when the request added just before it is `{i-1}_p`.
A request that merely happens to be called `0_x` stays alone: a family has two members or more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_CHILD_ID = re.compile(r"(\d+)_(.+)", re.DOTALL)


def parse_child_id(request_id: str) -> tuple[int, str] | None:
    """(index, parent id) when `request_id` has a child's form `{index}_{parent}`, else None."""
    match = _CHILD_ID.fullmatch(request_id)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def follows(previous: str | None, request_id: str) -> str | None:
    """The parent id when `request_id` is the next child after `previous` (`{i-1}_p` -> `{i}_p`)."""
    child = parse_child_id(request_id)
    if child is None or previous is None:
        return None
    index, parent = child
    return parent if index >= 1 and previous == f"{index - 1}_{parent}" else None


def group_children(request_ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Families among `request_ids` when their arrival order is unknown (a snapshot): parent ->
    children by index, for every parent with two children or more."""
    by_parent: dict[str, list[tuple[int, str]]] = {}
    for rid in request_ids:
        child = parse_child_id(rid)
        if child is not None:
            by_parent.setdefault(child[1], []).append((child[0], rid))
    return {
        parent: tuple(rid for _, rid in sorted(children))
        for parent, children in by_parent.items()
        if len(children) >= 2
    }
