"""`EventBus.holding` and `deliver`: what async scheduling uses to tell a step's events in the
plain loop's order (`engine/async_step.py`).

The oracle is the subscriber's own record: inside `holding()` it hears nothing, the held list
has every event emitted there in order, and `deliver` tells a list in order, once.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nanovllm.events import EventBus, RequestRejected


def event(i: int) -> RequestRejected:
    return RequestRejected(str(i), "")


def test_held_events_are_told_only_when_delivered() -> None:
    bus, heard = EventBus(), []
    bus.subscribe(heard.append)
    bus.emit(event(0))
    with bus.holding() as held:
        bus.emit(event(1))
        bus.emit(event(2))
        assert heard == [event(0)]
    assert held == [event(1), event(2)] and heard == [event(0)]
    bus.emit(event(3))  # (after the block: told at once)
    bus.deliver(held)
    assert heard == [event(0), event(3), event(1), event(2)]


def test_holding_into_a_list_appends_and_nested_blocks_hold_their_own() -> None:
    bus, heard = EventBus(), []
    bus.subscribe(heard.append)
    earlier = [event(0)]
    with bus.holding(earlier) as held:
        bus.emit(event(1))
        with bus.holding() as inner:
            bus.emit(event(2))
        bus.emit(event(3))
        bus.deliver([event(9)])  # delivered at once, even inside a block
    assert held is earlier and earlier == [event(0), event(1), event(3)]
    assert inner == [event(2)] and heard == [event(9)]


@given(st.lists(st.sampled_from(["emit", "hold", "release"]), max_size=40))
def test_every_event_is_told_once_and_in_order_within_its_list(program: list[str]) -> None:
    """Emits inside any nesting of blocks: each event reaches the subscriber exactly once (those
    outside every block at once, those held when their list is delivered), in emission order
    within its list."""
    bus, heard = EventBus(), []
    bus.subscribe(heard.append)
    blocks, lists, outside, n = [], [], [], 0
    for op in program:
        if op == "emit":
            bus.emit(event(n))
            if not blocks:
                outside.append(event(n))
            n += 1
        elif op == "hold":
            block = bus.holding()
            lists.append(block.__enter__())
            blocks.append(block)
        elif blocks:
            blocks.pop().__exit__(None, None, None)
    while blocks:
        blocks.pop().__exit__(None, None, None)
    assert heard == outside
    for held in lists:
        assert [int(e.request_id) for e in held] == sorted(int(e.request_id) for e in held)
        bus.deliver(held)
    assert sorted(int(e.request_id) for e in heard) == list(range(n))
