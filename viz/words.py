"""Numbers in words: `1 token`, `2 tokens`. Every label and story line of the visualizer counts
with `count`, so none says "1 tokens"."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 token`, `2 tokens`: a number with its noun, singular or plural as English wants."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
