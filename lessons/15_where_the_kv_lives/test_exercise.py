"""Lesson 15 properties: the host tier is an LRU cache of block hashes in slots.

The oracle is a plain list of the hashes in the tier, least recently used first, with the slot
the tier gave each. hypothesis drives the tier and the list side by side (a rule-based state
machine: insert with and without pinned entries, lookup, touch, num_matched, remove, clear, in
any order) and compares them after every call. The invariant the exercise states, "every slot
is free or holds exactly one hash", is checked after every call on the tier's own `slot_of` and
`free_slots`, and from outside too: while the tier holds fewer than `num_blocks` hashes an
insert must find a free slot (evict nothing), a slot the tier gives must hold no other hash, and
once it is full an insert must evict. What a random run reaches only now and then (a `clear` or
a `remove` of a tier in use, then filling it again; a lookup of the entry next to be evicted)
has a property of its own that always does.

A failure shows the calls that led to it as code, runnable as written, the wrong answer marked
on its line: `tier.insert(h0)  # returned None, expected a slot`.

The hashes are real block hashes (`core/block_hash.py`) of a few one-token blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar

from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from nanovllm.core.block_hash import hash_block_tokens, short
from nanovllm.lessons.harness import EXAMPLE_DEADLINE_S, deadline
from nanovllm.lessons.testing import (
    add_note,
    driven_settings,
    expect_raises,
    lesson_settings,
    run_mode,
    show_inputs,
)

HASHES = tuple(hash_block_tokens(None, [i]) for i in range(8))
NAMES = {h: f"h{i}" for i, h in enumerate(HASHES)}  # how a failure names them
HASH_OF = {name: h for h, name in NAMES.items()}


def _names_of(hashes) -> list[str]:
    return [NAMES[h] for h in hashes]


def _names(hashes) -> str:
    def name(h) -> str:
        return NAMES.get(h) or (short(h) if isinstance(h, bytes) else repr(h))

    return "[" + ", ".join(name(h) for h in hashes) + "]"


class Model:
    """The oracle: the tier's hashes in a list, least recently used first, and their slots."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.order: list[bytes] = []
        self.slot: dict[bytes, int] = {}

    def use(self, block_hash: bytes) -> None:
        self.order.remove(block_hash)
        self.order.append(block_hash)

    def victim(self, pinned: set[bytes]) -> bytes | None:
        return next((h for h in self.order if h not in pinned), None)

    def drop(self, block_hash: bytes) -> None:
        self.order.remove(block_hash)
        del self.slot[block_hash]


def _result(got) -> str:
    """What an insert returned, its hashes by name."""
    if isinstance(got, tuple) and len(got) == 2 and (got[1] is None or got[1] in NAMES):
        return f"(slot {got[0]!r}, evicted {'None' if got[1] is None else NAMES[got[1]]})"
    return repr(got)


def _pair(got, said: str) -> tuple:
    assert isinstance(got, tuple) and len(got) == 2, (
        f"{said} returned {got!r}: an insert returns (slot, evicted hash or None), or None"
    )
    return got


class Wrong(AssertionError):
    """A wrong answer of the tier: the message says why; `call` is the call that gave it, as
    code (None: the call last written down), `comment` what it returned and what was expected,
    for the transcript of calls (`Transcript`)."""

    def __init__(self, message: str, comment: str, call: str | None = None) -> None:
        super().__init__(message)
        self.comment = comment
        self.call = call


def expect(condition: bool, message: str, comment: str, call: str | None = None) -> None:
    if not condition:
        raise Wrong(message, comment, call)


def _code(pinned: set[bytes]) -> str:
    """The `pinned` argument as code: a set of the hashes' names."""
    return "{" + ", ".join(NAMES[h] for h in sorted(pinned, key=NAMES.get)) + "}"


def insert_call(block_hash: bytes, pinned: set[bytes]) -> str:
    """`tier.insert(...)` as code."""
    pins = f", pinned={_code(pinned)}" if pinned else ""
    return f"tier.insert({NAMES[block_hash]}{pins})"


def check_insert(tier, model: Model, block_hash: bytes, pinned: set[bytes]) -> None:
    """`tier.insert(block_hash, pinned)` against the model, which is updated to match."""
    before = _names(model.order)
    pins_before = set(pinned)
    got = tier.insert(block_hash, pinned)
    said = f"insert({NAMES[block_hash]}, pinned={_names(sorted(pins_before))}) into {before}"
    returned = f"returned {_result(got)}"
    expect(
        pinned == pins_before,
        f"{said} changed the caller's pinned set to {_names(sorted(pinned, key=repr))}: it is "
        "the engine's (the slots it reads this step), only to be read",
        f"{returned}, and changed pinned to {_names(sorted(pinned, key=repr))}",
    )
    if len(model.order) < model.num_blocks:
        expect(
            got is not None,
            f"{said} returned None, but the tier has a free slot",
            f"{returned}, expected a free slot",
        )
        slot, evicted = _pair(got, said)
        if evicted is not None:
            raise Wrong(
                f"{said} evicted {_names([evicted])}, but {len(model.order)} of "
                f"{model.num_blocks} slots are used: a free slot must be taken first",
                f"{returned}, expected a free slot and nothing evicted",
            )
        expect(
            isinstance(slot, int) and 0 <= slot < model.num_blocks,
            f"{said} gave slot {slot!r}: a slot is an int in [0, {model.num_blocks})",
            f"{returned}, expected a slot in range({model.num_blocks})",
        )
        owner = next((h for h, s in model.slot.items() if s == slot), None)
        if owner is not None:
            raise Wrong(
                f"{said} gave slot {slot}, which holds {NAMES[owner]}: a slot holds one hash",
                f"{returned}, but slot {slot} holds {NAMES[owner]}",
            )
    else:
        victim = model.victim(pinned)
        if victim is None:
            expect(
                got is None,
                f"{said} returned {_result(got)}, but every entry is pinned: it must return None "
                "and change nothing",
                f"{returned}, expected None (every entry is pinned)",
            )
            return
        expect(
            got is not None,
            f"{said} returned None, but {_names([victim])} is not pinned: evict it",
            f"{returned}, expected (slot {model.slot[victim]}, evicted {NAMES[victim]})",
        )
        slot, evicted = _pair(got, said)
        expect(
            evicted == victim,
            f"{said} evicted {_names([evicted]) if evicted is not None else 'nothing'}; the "
            f"least recently used entry that is not pinned is {_names([victim])}",
            f"{returned}, expected (slot {model.slot[victim]}, evicted {NAMES[victim]})",
        )
        expect(
            slot == model.slot[victim],
            f"{said} gave slot {slot}, but the slot it freed is {model.slot[victim]}",
            f"{returned}, expected (slot {model.slot[victim]}, evicted {NAMES[victim]})",
        )
        model.drop(victim)
    model.order.append(block_hash)
    model.slot[block_hash] = slot


def check_same(tier, model: Model, after: str) -> None:
    """The tier holds what the model holds, each hash in its slot: read from its `slot_of`
    when it keeps the one the exercise starts it with (reading it calls none of your methods,
    so a failure's calls are all the calls there were), else asked with `lookup`."""
    size = len(tier)
    expect(
        size == len(model.order),
        f"after {after}: len(tier) is {size}, but it holds {_names(model.order)}",
        f"returned {size}, expected {len(model.order)}",
        "len(tier)",
    )
    raw = tier.tier if isinstance(tier, Timed) else tier
    fields = getattr(raw, "slot_of", None)
    if isinstance(fields, Mapping):
        held = {NAMES.get(h, repr(h)): slot for h, slot in fields.items()}
        want = {NAMES[h]: model.slot[h] for h in model.order}
        expect(
            held == want,
            f"after {after}: the tier's slot_of holds {_slots(held)}; it should hold "
            f"{_slots(want)}",
            f"returned {_slots(held)}, expected {_slots(want)}",
            "dict(tier.slot_of)",
        )
        return
    for h in HASHES:
        inside = h in tier
        if inside != (h in model.slot):
            where = "is not" if h in model.slot else "is"
            raise Wrong(
                f"after {after}: {NAMES[h]} {where} in the tier; it should hold "
                f"{_names(model.order)}",
                f"returned {inside}, expected {not inside}",
                f"{NAMES[h]} in tier",
            )
        got = tier.lookup(h)
        expect(
            got == model.slot.get(h),
            f"after {after}: lookup({NAMES[h]}) is {got!r}, not {model.slot.get(h)!r}",
            f"returned {got!r}, expected {model.slot.get(h)!r}",
            f"tier.lookup({NAMES[h]})",
        )


def _slots(held: dict[str, int]) -> str:
    """{name: slot} as code, in name order."""
    return "{" + ", ".join(f"{name}: {slot!r}" for name, slot in sorted(held.items())) + "}"


def check_slots(tier, after: str) -> None:
    """The exercise's invariant, on the tier's own fields (when it keeps the `slot_of` and
    `free_slots` the exercise starts it with): every slot is free or holds exactly one hash."""
    held, free = getattr(tier, "slot_of", None), getattr(tier, "free_slots", None)
    if held is None or free is None:
        return
    held, free = list(held.values()), list(free)
    counts = {slot: held.count(slot) + free.count(slot) for slot in range(tier.num_blocks)}
    lost = [slot for slot, n in counts.items() if n == 0]
    twice = [slot for slot, n in counts.items() if n > 1]
    stray = sorted({slot for slot in held + free if slot not in counts}, key=repr)
    if lost or twice or stray:
        why = "; ".join(
            text
            for text in (
                f"{_slots_said(lost)} neither free nor held" if lost else "",
                f"{_slots_said(twice)} counted twice" if twice else "",
                f"{stray} are not slots of range({tier.num_blocks})" if stray else "",
            )
            if text
        )
        raise Wrong(
            f"after {after}: {why}; every slot must be free or hold exactly one hash "
            f"(slot_of holds {held}, free_slots {free})",
            f"returned ({sorted(held, key=repr)}, {free}): {why}",
            "sorted(tier.slot_of.values()), tier.free_slots",
        )


def _slots_said(slots: list[int]) -> str:
    """ "slot 3 is" or "slots 0, 1 are"."""
    if len(slots) == 1:
        return f"slot {slots[0]} is"
    return f"slots {', '.join(map(str, slots))} are"


class Transcript:
    """The calls made on one tier, as code a learner can run as written (`tier = ...`,
    `tier.insert(h0)`): a failure gets them as `lesson_calls`, its wrong answer marked on its
    line, and `report` prints them instead of hypothesis' draws."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.used: set[int] = set()

    def call(self, line: str, *hashes: bytes) -> None:
        self.lines.append(line)
        self.used.update(HASHES.index(h) for h in hashes)

    def attach(self, exc: BaseException) -> None:
        lines = list(self.lines)
        if isinstance(exc, Wrong):
            if exc.call is not None:
                lines.append(exc.call)
            lines[-1] += f"  # {exc.comment}"
        elif lines:
            lines[-1] += f"  # raised {type(exc).__name__}"
        names = [f"h{i}" for i in range(max(self.used, default=-1) + 1)]
        head = ["from nanovllm.core.block_hash import hash_block_tokens"]
        if len(names) == 1:
            head.append("h0 = hash_block_tokens(None, [0])")
        elif names:
            head.append(
                f"{', '.join(names)} = (hash_block_tokens(None, [i]) for i in range({len(names)}))"
            )
        try:
            exc.lesson_calls = head + lines  # type: ignore[attr-defined]
        except AttributeError:  # an exception type that takes no new attributes
            pass
        # pytest's report (`--check --full`) shows notes: the same calls, under hypothesis' steps.
        add_note(exc, "The calls, as code you can run:\n    " + "\n    ".join(head + lines))


class Timed:
    """The tier with a deadline on every call (`harness.deadline`): the state machine is not
    a hypothesis property the harness can time example by example, and a loop in an `insert`
    that never ends must stop the check, not hang it."""

    def __init__(self, tier) -> None:
        self.tier = tier

    def __getattr__(self, name: str):
        method = getattr(self.tier, name)

        def timed(*args):
            with deadline(EXAMPLE_DEADLINE_S):
                return method(*args)

        return timed

    def __len__(self) -> int:
        with deadline(EXAMPLE_DEADLINE_S):
            return len(self.tier)

    def __contains__(self, block_hash: bytes) -> bool:
        with deadline(EXAMPLE_DEADLINE_S):
            return block_hash in self.tier


def recorded(step):
    """A rule or invariant whose failure carries the calls made so far (`Transcript`)."""

    def run(self, **kwargs):
        try:
            return step(self, **kwargs)
        except BaseException as exc:  # a deadline's ExampleTimeout too
            if hasattr(self, "transcript"):
                self.transcript.attach(exc)
            raise

    run.__name__ = step.__name__
    run.__doc__ = step.__doc__
    return run


class TierMachine(RuleBasedStateMachine):
    """The tier under test (`impl.HostBlockTier`) and the model, driven alike."""

    def __init__(self, impl) -> None:
        super().__init__()
        self.impl = impl

    @initialize(num_blocks=st.integers(1, 5))
    @recorded
    def build(self, num_blocks):
        self.transcript = Transcript()
        self.transcript.call(f"tier = HostBlockTier({num_blocks})")
        self.tier = Timed(self.impl.HostBlockTier(num_blocks))
        self.model = Model(num_blocks)
        self.last = f"HostBlockTier({num_blocks})"

    def _draw_held(self, data) -> bytes:
        """One of the hashes in the tier (drawn by name: a failure shows the steps with it)."""
        return HASH_OF[data.draw(st.sampled_from(_names_of(self.model.order)), label="hash")]

    @rule(data=st.data())
    @recorded
    def insert(self, data):
        absent = [h for h in HASHES if h not in self.model.slot]
        block_hash = HASH_OF[data.draw(st.sampled_from(_names_of(absent)), label="hash")]
        held = _names_of(sorted(self.model.order))
        how = data.draw(st.sampled_from(["none", "some", "all"]), label="pins")
        pinned = set()
        if how == "all":
            pinned = {HASH_OF[name] for name in held}
        elif how == "some" and held:
            pinned = {HASH_OF[name] for name in data.draw(st.sets(st.sampled_from(held)))}
        self.transcript.call(insert_call(block_hash, pinned), block_hash, *pinned)
        check_insert(self.tier, self.model, block_hash, pinned)
        self.last = f"insert({NAMES[block_hash]}, pinned={_names(sorted(pinned))})"

    @rule(name=st.sampled_from(sorted(HASH_OF)))
    @recorded
    def lookup(self, name):
        block_hash = HASH_OF[name]
        self.transcript.call(f"tier.lookup({name})", block_hash)
        got = self.tier.lookup(block_hash)
        want = self.model.slot.get(block_hash)
        expect(
            got == want,
            f"lookup({name}) is {got!r}, not {want!r} (the tier holds {_names(self.model.order)})",
            f"returned {got!r}, expected {want!r}",
        )
        self.last = f"lookup({name})"

    @precondition(lambda self: self.model.order)
    @rule(data=st.data())
    @recorded
    def touch(self, data):
        block_hash = self._draw_held(data)
        self.transcript.call(f"tier.touch({NAMES[block_hash]})", block_hash)
        self.tier.touch(block_hash)
        self.model.use(block_hash)
        self.last = f"touch({NAMES[block_hash]})"

    @rule(names=st.lists(st.sampled_from(sorted(HASH_OF)), max_size=6))
    @recorded
    def num_matched(self, names):
        hashes = [HASH_OF[name] for name in names]
        self.transcript.call(f"tier.num_matched([{', '.join(names)}])", *hashes)
        want = 0
        while want < len(hashes) and hashes[want] in self.model.slot:
            want += 1
        got = self.tier.num_matched(hashes)
        expect(
            got == want,
            f"num_matched({_names(hashes)}) is {got!r}, but the tier holds "
            f"{_names(self.model.order)}: the first {want} are all in it",
            f"returned {got!r}, expected {want}",
        )
        self.last = f"num_matched({_names(hashes)})"

    @precondition(lambda self: self.model.order)
    @rule(data=st.data())
    @recorded
    def remove(self, data):
        block_hash = self._draw_held(data)
        self.transcript.call(f"tier.remove({NAMES[block_hash]})", block_hash)
        self.tier.remove(block_hash)
        self.model.drop(block_hash)
        self.last = f"remove({NAMES[block_hash]})"

    @precondition(lambda self: self.model.order)  # clearing an empty tier shows nothing
    @rule()
    @recorded
    def clear(self):
        self.transcript.call("tier.clear()")
        self.tier.clear()
        self.model.order.clear()
        self.model.slot.clear()
        self.last = "clear()"

    @invariant()
    @recorded
    def same_as_the_model(self):
        if hasattr(self, "tier"):
            check_slots(self.tier.tier, self.last)
            check_same(self.tier, self.model, self.last)


def _machine(impl) -> Callable[[], TierMachine]:
    """A new machine for every example, each driving `impl`'s tier."""
    return functools.partial(TierMachine, impl)


def _run_machine(impl, max_examples: int, steps: int) -> None:
    """Run the state machine as the harness runs a property (`testing.run_mode()`): fresh
    examples or the same ones every run, its cap on examples, shrinking for a learner's check.
    Under pytest, derandomized examples, shrunk."""
    mode = run_mode()
    fresh, shrink = False, True
    if mode is not None:
        fresh, shrink = mode.fresh, mode.shrink
        max_examples = max(1, round(max_examples * mode.scale))
        if mode.max_examples is not None:
            max_examples = min(max_examples, mode.max_examples)
    run_state_machine_as_test(
        _machine(impl),
        settings=driven_settings(
            max_examples,
            fresh=fresh,
            shrink=shrink,
            stateful_step_count=steps,
            report_multiple_bugs=False,
            print_blob=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_the_tier_behaves_like_a_list_in_lru_order(impl):
    """Any sequence of insert, lookup, touch, num_matched, remove and clear leaves the tier
    holding what a plain list in LRU order holds, each hash in the slot it was given: a free
    slot is taken while there is one, a full tier evicts its least recently used entry that is
    not pinned (and gives its slot to the new hash), and refuses (None, nothing changed) only
    when every entry is pinned; lookup and num_matched change no order, touch does."""
    with expect_raises(ValueError, "HostBlockTier(0)"):
        impl.HostBlockTier(0)
    _run_machine(impl, max_examples=30, steps=20)


# --- the same rules, one at a time -----------------------------------------------------------


_CALLS: ContextVar[Transcript | None] = ContextVar("lesson15_calls", default=None)


class Recorded:
    """A tier whose method calls are written down as code in a `Transcript` (`tier.insert(h0)`),
    for a property that is not the state machine: its failure shows the calls too."""

    def __init__(self, tier, transcript: Transcript) -> None:
        self.tier = tier
        self.transcript = transcript

    def __getattr__(self, name: str):
        attr = getattr(self.tier, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args):
            shown = list(args)
            if name == "insert" and len(shown) == 2 and not shown[1]:
                shown.pop()  # no pins: the default
            hashes = [h for a in args for h in (a if isinstance(a, set | list) else [a])]
            self.transcript.call(
                f"tier.{name}({', '.join(_as_code(a) for a in shown)})",
                *(h for h in hashes if h in NAMES),
            )
            return attr(*args)

        return call

    def __len__(self) -> int:
        return len(self.tier)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.tier


def _as_code(value) -> str:
    """An argument as code, its hashes by name."""
    if isinstance(value, bytes) and value in NAMES:
        return NAMES[value]
    if isinstance(value, set):
        return _code(value) if value else "set()"
    if isinstance(value, list):
        return "[" + ", ".join(_as_code(v) for v in value) + "]"
    return repr(value)


def new_tier(impl, num_blocks: int):
    """`impl.HostBlockTier(num_blocks)`, its calls written down when a `calls_shown` property
    runs."""
    transcript = _CALLS.get()
    if transcript is None:
        return impl.HostBlockTier(num_blocks)
    transcript.call(f"tier = HostBlockTier({num_blocks})")
    return Recorded(impl.HostBlockTier(num_blocks), transcript)


def calls_shown(prop):
    """A property whose failure shows the calls it made on its tier as code (`Transcript`)."""

    @functools.wraps(prop)
    def wrapper(*args, **kwargs):
        transcript = Transcript()
        token = _CALLS.set(transcript)
        try:
            return prop(*args, **kwargs)
        except Exception as exc:
            transcript.attach(exc)
            raise
        finally:
            _CALLS.reset(token)

    return wrapper


def _filled(impl, num_blocks: int, uses: list[int]) -> tuple[object, Model]:
    """A tier of `num_blocks` slots filled with HASHES[0..num_blocks), then the entries at the
    indices `uses` touched in that order; and the model of it."""
    tier, model = new_tier(impl, num_blocks), Model(num_blocks)
    for h in HASHES[:num_blocks]:
        check_insert(tier, model, h, set())
    for i in uses:
        h = HASHES[i % num_blocks]
        tier.touch(h)
        model.use(h)
    return tier, model


@lesson_settings(40)
@example(num_blocks=2, uses=[0], pins=[False] * 6)  # h0 used again: h1 is evicted, not h0
@given(
    num_blocks=st.integers(1, 6),
    uses=st.lists(st.integers(0, 5), max_size=8),
    pins=st.lists(st.booleans(), min_size=6, max_size=6),
)
@show_inputs
@calls_shown
def test_insert_evicts_the_least_recently_used_unpinned_entry(impl, num_blocks, uses, pins):
    """A full tier, its entries used in some order, some of them pinned: a new hash takes the
    slot of the least recently used entry that is not pinned, and that entry is gone."""
    tier, model = _filled(impl, num_blocks, uses)
    pinned = {h for h, pin in zip(HASHES[:num_blocks], pins) if pin}
    check_insert(tier, model, HASHES[7], pinned)
    check_same(tier, model, f"insert(h7, pinned={_names(sorted(pinned))})")


@lesson_settings(30)
@given(num_blocks=st.integers(1, 6), uses=st.lists(st.integers(0, 5), max_size=8))
@show_inputs
@calls_shown
def test_a_tier_whose_every_entry_is_pinned_refuses_and_changes_nothing(impl, num_blocks, uses):
    """With every entry pinned, insert returns None and changes nothing; unpin one, and that is
    the one evicted."""
    tier, model = _filled(impl, num_blocks, uses)
    everything = set(model.order)
    check_insert(tier, model, HASHES[7], everything)
    check_same(tier, model, "an insert with every entry pinned")
    spare = model.order[-1]
    check_insert(tier, model, HASHES[7], everything - {spare})
    check_same(tier, model, f"insert(h7) with all pinned but {NAMES[spare]}")


@lesson_settings(20)
@example(held={0})  # h0 is held, h1 to h7 are not
@given(held=st.sets(st.integers(0, 7), min_size=1, max_size=5))
@show_inputs
@calls_shown
def test_lookup_gives_the_slot_of_a_held_hash_and_none_otherwise(impl, held):
    """lookup of every hash, some held and the rest not: each held one gives the slot the
    tier gave it, every other one None."""
    tier, model = new_tier(impl, 5), Model(5)
    for i in sorted(held):
        check_insert(tier, model, HASHES[i], set())
    for h in HASHES:
        got = tier.lookup(h)
        assert got == model.slot.get(h), (
            f"lookup({NAMES[h]}) is {got!r}, not {model.slot.get(h)!r} (the tier holds "
            f"{_slots({NAMES[k]: slot for k, slot in model.slot.items()})})"
        )
    check_same(tier, model, "a lookup of every hash")


@lesson_settings(40)
@given(
    held=st.sets(st.integers(0, 7), max_size=5),
    asked=st.lists(st.integers(0, 7), max_size=8),
)
@show_inputs
@calls_shown
def test_num_matched_is_the_length_of_the_prefix_hit(impl, held, asked):
    """num_matched counts the hashes from the first while the tier holds each, stops at the
    first it does not hold, and changes no order."""
    tier, model = new_tier(impl, 5), Model(5)
    for i in sorted(held):
        check_insert(tier, model, HASHES[i], set())
    hashes = [HASHES[i] for i in asked]
    want = 0
    while want < len(hashes) and hashes[want] in model.slot:
        want += 1
    got = tier.num_matched(hashes)
    assert got == want, (
        f"num_matched({_names(hashes)}) is {got!r}, but the tier holds {_names(model.order)}: "
        f"the first {want} are all in it"
    )
    check_same(tier, model, f"num_matched({_names(hashes)})")
    if len(model.order) == model.num_blocks:  # the order is unchanged: the LRU goes first
        check_insert(tier, model, next(h for h in HASHES if h not in model.slot), set())


@lesson_settings(10)
@example(num_blocks=2, removed=0)
@given(num_blocks=st.integers(1, 5), removed=st.integers(0, 4))
@show_inputs
@calls_shown
def test_remove_and_clear_give_every_slot_back(impl, num_blocks, removed):
    """A full tier gives a removed entry's slot to the next insert (evicting nothing), and after
    `clear` it takes `num_blocks` new hashes, each in a free slot of its own, before it evicts
    again: remove and clear free every slot they forget, once."""
    tier, model = _filled(impl, num_blocks, [])
    gone = HASHES[removed % num_blocks]
    tier.remove(gone)
    model.drop(gone)
    check_slots(tier, f"remove({NAMES[gone]})")
    check_insert(tier, model, HASHES[7], set())
    check_same(tier, model, f"remove({NAMES[gone]}), then insert(h7)")
    tier.clear()
    model.order.clear()
    model.slot.clear()
    check_slots(tier, "clear()")
    check_same(tier, model, "clear()")
    for h in HASHES[:num_blocks]:
        check_insert(tier, model, h, set())
    check_same(tier, model, f"clear(), then {num_blocks} inserts")
    check_insert(tier, model, HASHES[7], set())  # full again: evicts h0, the oldest


@lesson_settings(10)
@example(num_blocks=2, names=["h0"])
@given(
    num_blocks=st.integers(2, 5),
    names=st.lists(st.sampled_from(["h0", "h1", "h2", "h3", "h4"]), min_size=1, max_size=5),
)
@show_inputs
@calls_shown
def test_lookup_and_num_matched_leave_the_next_to_evict_alone(impl, num_blocks, names):
    """Looking up the least recently used entry, or matching a prefix that starts with it, does
    not save it: the next insert into the full tier still evicts it (only `touch` marks an entry
    used)."""
    tier, model = _filled(impl, num_blocks, [])
    asked = ["h0"] + names
    for name in asked:
        tier.lookup(HASH_OF[name])
    tier.num_matched([HASH_OF[name] for name in asked])
    check_insert(tier, model, HASHES[7], set())
