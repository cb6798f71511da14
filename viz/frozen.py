"""Changed copies of immutable values, made fast: `evolve` for a frozen dataclass, `without`
for a tuple.

The reducers (`state.py` and its panels) make a changed copy of a frozen record for nearly
every event. `dataclasses.replace` reads every field and calls `__init__` again, which for a
record of twenty fields costs more than the change itself; `evolve` copies the instance's
fields as they are and sets the changed ones. It is only for dataclasses without
`__post_init__` or `__slots__` (the visualizer's records), and only with field names.

`without(items, item)` is the tuple less one item: the queues and the free block queue lose an
entry that way.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def evolve(obj: T, **changes) -> T:
    """A copy of `obj` with `changes` set: like `dataclasses.replace`, without `__init__`."""
    if not changes.keys() <= obj.__dict__.keys():
        unknown = sorted(changes.keys() - obj.__dict__.keys())
        raise TypeError(f"{type(obj).__name__} has no field {unknown[0]!r}")
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def without(items: tuple, item: object) -> tuple:
    """`items` less the first `item` (the same tuple when `item` is not in it)."""
    if item not in items:
        return items
    i = items.index(item)
    return items[:i] + items[i + 1 :]
