"""Lesson 15 properties: the host tier is an LRU cache of block hashes in slots.

The oracle is a plain list of the hashes in the tier, least recently used first, with the slot
the tier gave each. hypothesis drives the tier and the list side by side (a rule-based state
machine: insert with and without pinned entries, lookup, touch, num_matched, remove, clear, in
any order) and compares them after every call. Whether a slot is free cannot be seen from
outside, but the invariant "every slot is free or holds exactly one hash" can: while the tier
holds fewer than `num_blocks` hashes an insert must find a free slot (evict nothing), a slot
the tier gives must hold no other hash, and once it is full an insert must evict.

The hashes are real block hashes (`core/block_hash.py`) of a few one-token blocks.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given
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
    return "[" + ", ".join(NAMES.get(h, short(h)) for h in hashes) + "]"


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


def check_insert(tier, model: Model, block_hash: bytes, pinned: set[bytes]) -> None:
    """`tier.insert(block_hash, pinned)` against the model, which is updated to match."""
    before = _names(model.order)
    got = tier.insert(block_hash, pinned)
    said = f"insert({NAMES[block_hash]}, pinned={_names(sorted(pinned))}) into {before}"
    if len(model.order) < model.num_blocks:
        assert got is not None, f"{said} returned None, but the tier has a free slot"
        slot, evicted = _pair(got, said)
        assert evicted is None, (
            f"{said} evicted {_names([evicted])}, but {len(model.order)} of "
            f"{model.num_blocks} slots are used: a free slot must be taken first"
        )
        assert isinstance(slot, int) and 0 <= slot < model.num_blocks, (
            f"{said} gave slot {slot!r}: a slot is an int in [0, {model.num_blocks})"
        )
        owner = next((h for h, s in model.slot.items() if s == slot), None)
        assert owner is None, (
            f"{said} gave slot {slot}, which holds {_names([owner])}: a slot holds one hash"
        )
    else:
        victim = model.victim(pinned)
        if victim is None:
            assert got is None, (
                f"{said} returned {_result(got)}, but every entry is pinned: it must return None "
                "and change nothing"
            )
            return
        assert got is not None, (
            f"{said} returned None, but {_names([victim])} is not pinned: evict it"
        )
        slot, evicted = _pair(got, said)
        assert evicted == victim, (
            f"{said} evicted {_names([evicted]) if evicted is not None else 'nothing'}; the "
            f"least recently used entry that is not pinned is {_names([victim])}"
        )
        assert slot == model.slot[victim], (
            f"{said} gave slot {slot}, but the slot it freed is {model.slot[victim]}"
        )
        model.drop(victim)
    model.order.append(block_hash)
    model.slot[block_hash] = slot


def check_same(tier, model: Model, after: str) -> None:
    """The tier holds what the model holds, each hash in its slot."""
    assert len(tier) == len(model.order), (
        f"after {after}: len(tier) is {len(tier)}, but it holds {_names(model.order)}"
    )
    for h in HASHES:
        if (h in tier) != (h in model.slot):
            where = "is not" if h in model.slot else "is"
            raise AssertionError(
                f"after {after}: {NAMES[h]} {where} in the tier; it should hold "
                f"{_names(model.order)}"
            )
        got = tier.lookup(h)
        assert got == model.slot.get(h), (
            f"after {after}: lookup({NAMES[h]}) is {got!r}, not {model.slot.get(h)!r}"
        )


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


class TierMachine(RuleBasedStateMachine):
    """The tier under test (`impl.HostBlockTier`) and the model, driven alike."""

    impl = None  # set by `_machine`

    @initialize(num_blocks=st.integers(1, 5))
    def build(self, num_blocks):
        self.tier = Timed(self.impl.HostBlockTier(num_blocks))
        self.model = Model(num_blocks)
        self.last = f"HostBlockTier({num_blocks})"

    def _draw_held(self, data) -> bytes:
        """One of the hashes in the tier (drawn by name: a failure shows the steps with it)."""
        return HASH_OF[data.draw(st.sampled_from(_names_of(self.model.order)), label="hash")]

    @rule(data=st.data())
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
        check_insert(self.tier, self.model, block_hash, pinned)
        self.last = f"insert({NAMES[block_hash]}, pinned={_names(sorted(pinned))})"

    @rule(name=st.sampled_from(sorted(HASH_OF)))
    def lookup(self, name):
        block_hash = HASH_OF[name]
        got = self.tier.lookup(block_hash)
        assert got == self.model.slot.get(block_hash), (
            f"lookup({name}) is {got!r}, not {self.model.slot.get(block_hash)!r} "
            f"(the tier holds {_names(self.model.order)})"
        )
        self.last = f"lookup({name})"

    @precondition(lambda self: self.model.order)
    @rule(data=st.data())
    def touch(self, data):
        block_hash = self._draw_held(data)
        self.tier.touch(block_hash)
        self.model.use(block_hash)
        self.last = f"touch({NAMES[block_hash]})"

    @rule(names=st.lists(st.sampled_from(sorted(HASH_OF)), max_size=6))
    def num_matched(self, names):
        hashes = [HASH_OF[name] for name in names]
        want = 0
        while want < len(hashes) and hashes[want] in self.model.slot:
            want += 1
        got = self.tier.num_matched(hashes)
        assert got == want, (
            f"num_matched({_names(hashes)}) is {got!r}, but the tier holds "
            f"{_names(self.model.order)}: the first {want} are all in it"
        )
        self.last = f"num_matched({_names(hashes)})"

    @precondition(lambda self: self.model.order)
    @rule(data=st.data())
    def remove(self, data):
        block_hash = self._draw_held(data)
        self.tier.remove(block_hash)
        self.model.drop(block_hash)
        self.last = f"remove({NAMES[block_hash]})"

    @rule()
    def clear(self):
        self.tier.clear()
        self.model.order.clear()
        self.model.slot.clear()
        self.last = "clear()"

    @invariant()
    def same_as_the_model(self):
        if hasattr(self, "tier"):
            check_same(self.tier, self.model, self.last)


def _machine(impl) -> type[TierMachine]:
    return type("TierMachine", (TierMachine,), {"impl": impl})


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


def _filled(impl, num_blocks: int, uses: list[int]) -> tuple[object, Model]:
    """A tier of `num_blocks` slots filled with HASHES[0..num_blocks), then the entries at the
    indices `uses` touched in that order; and the model of it."""
    tier, model = impl.HostBlockTier(num_blocks), Model(num_blocks)
    for h in HASHES[:num_blocks]:
        check_insert(tier, model, h, set())
    for i in uses:
        h = HASHES[i % num_blocks]
        tier.touch(h)
        model.use(h)
    return tier, model


@lesson_settings(40)
@given(
    num_blocks=st.integers(1, 6),
    uses=st.lists(st.integers(0, 5), max_size=8),
    pins=st.lists(st.booleans(), min_size=6, max_size=6),
)
@show_inputs
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


@lesson_settings(40)
@given(
    held=st.sets(st.integers(0, 7), max_size=5),
    asked=st.lists(st.integers(0, 7), max_size=8),
)
@show_inputs
def test_num_matched_is_the_length_of_the_prefix_hit(impl, held, asked):
    """num_matched counts the hashes from the first while the tier holds each, stops at the
    first it does not hold, and changes no order."""
    tier, model = impl.HostBlockTier(5), Model(5)
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
