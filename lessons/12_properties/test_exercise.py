"""Lesson 12 checks: your properties must pass on the engine and catch every planted bug.

Here `impl` is a module of *properties* (yours, or the reference solution). hypothesis drives each
property with generated scripts, against the engine's systems and then against each system with a
planted bug.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import NamedTuple

from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from nanovllm.core.free_block_queue import FreeBlockQueue
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.lessons.catalog import get_lesson, lesson_module
from nanovllm.lessons.scripts import AllocatorCase
from nanovllm.lessons.testing import driven_settings, run_mode

# --- inputs -----------------------------------------------------------------------------------


@st.composite
def queue_scripts(draw) -> list[tuple[str, int]]:
    """Legal scripts for a queue of blocks 0..7, built alongside a list model."""
    model, out, script = list(range(8)), [], []
    for _ in range(draw(st.integers(0, 30))):
        choices = [op for op, ok in (("popleft", model), ("append", out), ("remove", model)) if ok]
        op = draw(st.sampled_from(choices))
        k = draw(st.integers(0, 7))
        if op == "popleft":
            out.append(model.pop(0))
            script.append(("popleft", -1))
        elif op == "append":
            block = out.pop(k % len(out))
            model.append(block)
            script.append(("append", block))
        else:
            block = model.pop(k % len(model))
            out.append(block)
            script.append(("remove", block))
    return script


@st.composite
def allocator_cases(draw) -> AllocatorCase:
    # Few request ids and scripts of 6+ operations: requests come back after being freed (as
    # preempted ones do) in most scripts, which is where allocator bugs show.
    ids = st.sampled_from("abc")
    op = st.one_of(
        st.tuples(st.just("allocate"), ids, st.integers(1, 8)),
        st.tuples(st.just("free"), ids),
    )
    return AllocatorCase(
        num_blocks=draw(st.integers(2, 10), label="num_blocks"),
        block_size=draw(st.sampled_from([1, 2, 4]), label="block_size"),
        script=tuple(draw(st.lists(op, min_size=6, max_size=25), label="script")),
    )


class SlotCase(NamedTuple):
    block_table: list[int]
    block_size: int


@st.composite
def slot_cases(draw) -> SlotCase:
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8]), label="block_size")
    num_blocks = draw(st.integers(1, 6), label="num_blocks")
    seed = draw(st.integers(0, 10**6), label="seed")
    return SlotCase(random.Random(seed).sample(range(num_blocks + 4), num_blocks), block_size)


# --- the systems: the engine's, and the planted bugs ----------------------------------------------


@lru_cache(maxsize=256)
def _engine_slots(block_table: tuple[int, ...], block_size: int) -> list[int]:
    """The engine's slot mapping (lesson 02's reference) of every position of the table, in one
    `prepare_inputs` call per table rather than one per position."""
    reference = lesson_module(get_lesson("02_paged_blocks"), "reference")
    return reference.slot_mapping(list(block_table), 0, len(block_table) * block_size, block_size)


def _engine_slot_for(block_table, position, block_size):
    return _engine_slots(tuple(block_table), block_size)[position]


ENGINE = {
    "FreeBlockQueue": FreeBlockQueue,
    "make_manager": lambda num_blocks, block_size: KVCacheManager(num_blocks, block_size, False),
    "slot_for": _engine_slot_for,
}


class _LifoQueue(FreeBlockQueue):
    def popleft(self):
        block = self._tail.prev_free
        if block is self._head:
            raise ValueError("no free blocks left")
        self.remove(block)
        return block


class _MiscountingQueue(FreeBlockQueue):
    def remove(self, block):
        super().remove(block)
        self.num_free_blocks += 1


class _LeakyManager(KVCacheManager):
    """free() forgets the request's last block: it stays taken, owned by nobody."""

    def free(self, request):
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks:
            blocks.pop()
        super().free(request)


class _StaleTableManager(KVCacheManager):
    """free() leaves the request's block table behind: a request that comes back (a preempted
    one) starts from blocks that are free again or belong to someone else, and freeing it again
    frees them a second time."""

    def free(self, request):
        blocks = list(self.req_to_blocks.get(request.request_id, []))
        super().free(request)
        self.req_to_blocks[request.request_id] = blocks


class _GreedyFailureManager(KVCacheManager):
    """A failed allocation keeps one block it grabbed before running out."""

    def allocate_slots(
        self, request, num_new_tokens, new_computed_blocks=None, num_lookahead_tokens=0
    ):
        result = super().allocate_slots(
            request, num_new_tokens, new_computed_blocks, num_lookahead_tokens
        )
        if result is None and self.num_free_blocks > 0:
            self.free_block_queue.popleft().ref_cnt = 1
        return result


BUGS = {
    "lifo_queue": (
        "the queue hands out the most recently freed block",
        {"FreeBlockQueue": _LifoQueue},
    ),
    "miscounting_queue": (
        "remove forgets to decrement num_free_blocks",
        {"FreeBlockQueue": _MiscountingQueue},
    ),
    "leaking_allocator": (
        "freeing a request forgets its last block",
        {"make_manager": lambda n, b: _LeakyManager(n, b, False)},
    ),
    "double_free": (
        "freeing leaves the block table behind; a returning request reuses it",
        {"make_manager": lambda n, b: _StaleTableManager(n, b, False)},
    ),
    "failed_allocation_leaks": (
        "a failed allocation keeps a block",
        {"make_manager": lambda n, b: _GreedyFailureManager(n, b, False)},
    ),
    "slot_off_by_one": (
        "slot_for is one slot too far",
        {"slot_for": lambda t, p, bs: _engine_slot_for(t, p, bs) + 1},
    ),
    "slot_ignores_table": (
        "slot_for returns the position itself",
        {"slot_for": lambda t, p, bs: p},
    ),
}

# Which system each property gets, and its inputs (the slot cases are two arguments).
PROPERTIES = [
    ("prop_free_queue", "FreeBlockQueue", queue_scripts().map(lambda s: (s,))),
    ("prop_allocator", "make_manager", allocator_cases().map(lambda c: (c,))),
    ("prop_slot_mapping", "slot_for", slot_cases()),
]


def _run(prop, system, inputs, *, max_examples: int, quiet: bool) -> None:
    """Drive one property with hypothesis; raises whatever the property raises.

    Under pytest: derandomized (the same scripts every check: a verdict on your properties does
    not change from run to run), shrinking when looking for a false alarm (`quiet=False`). Run
    in-process (`testing.run_mode()`), the harness decides: fresh scripts or not, a cap on
    examples, and shrinking only for a learner's check.
    """
    mode = run_mode()
    fresh, shrink = False, not quiet
    if mode is not None:
        fresh, shrink = mode.fresh, mode.shrink and not quiet
        if not quiet and mode.max_examples:
            # Looking for a false alarm: any one found is real, so fewer examples may be tried.
            # (Not when looking for a catch: fewer examples could miss a bug that is there.)
            max_examples = min(max_examples, mode.max_examples)

    @driven_settings(
        max_examples, fresh=fresh, shrink=shrink, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(args=inputs)
    def search(args):
        prop(system, *args)

    search()


# Examples per property when looking for a planted bug. Fresh random scripts must catch every
# bug every time with the reference properties: measured, 40 missed none in 300 runs.
CATCH_EXAMPLES = 60


# --- the checks -----------------------------------------------------------------------------------


def test_your_properties_pass_on_the_engine(impl):
    """No false alarms: on the engine's own code every property must hold."""
    for name, system, inputs in PROPERTIES:
        _run(getattr(impl, name), ENGINE[system], inputs, max_examples=30, quiet=False)


def _catches(impl, systems, first: str, max_examples: int) -> bool:
    """Whether some property of `impl` fails against `systems`; the ones that drive the system
    named `first` are tried first."""
    for name, system, inputs in sorted(PROPERTIES, key=lambda prop: prop[1] != first):
        try:
            _run(
                getattr(impl, name), systems[system], inputs, max_examples=max_examples, quiet=True
            )
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 - any failure of a property is a catch
            return True
    return False


def _catch_test(bug: str):
    description, overrides = BUGS[bug]

    def test(impl):
        systems = {**ENGINE, **overrides}
        if not _catches(impl, systems, next(iter(overrides)), CATCH_EXAMPLES):
            raise AssertionError(f"planted bug not caught by any of your properties: {description}")

    test.__name__ = f"test_catches_{bug}"
    test.__doc__ = f"Some property must fail when {description}."
    return test


for _bug in BUGS:
    globals()[f"test_catches_{_bug}"] = _catch_test(_bug)
del _bug


SHOWN_MUTANTS = 3  # surviving mutants shown (the search stops there)


def test_catches_every_generated_mutant(impl):
    """Some property must fail on every generated mutant of the allocator and of slot_for: each
    small change a mutation tool makes to the engine's code (`nanovllm.lessons.mutation`), not
    only the planted bugs above. (Those that change nothing your properties could see are listed
    in this lesson's equivalent_mutants.txt, each with the reason.)"""
    from nanovllm.lessons import mutation

    lesson = get_lesson("12_properties")
    listed = mutation.equivalents(lesson)
    pool = [m for m in mutation.generate(lesson.name) if m.id not in listed]
    missed = []
    for mutant in pool:
        first = "slot_for" if mutant.module.endswith("step_inputs") else "make_manager"
        with mutation.applied(lesson, mutant):
            _engine_slots.cache_clear()  # slot mappings computed without this mutant
            try:
                # Most mutants show within a few examples; the rest get the planted bugs' count.
                caught = _catches(impl, ENGINE, first, 8) or _catches(
                    impl, ENGINE, first, CATCH_EXAMPLES
                )
            finally:
                _engine_slots.cache_clear()
        if not caught:
            missed.append(mutant)
            if len(missed) == SHOWN_MUTANTS:  # enough to show; the rest are not run
                break
    if missed:
        count = f"{len(missed)}" if len(missed) < SHOWN_MUTANTS else f"At least {len(missed)}"
        shown = "\n\n".join(m.diff() for m in missed)
        raise AssertionError(
            f"{count} of the {len(pool)} generated mutants of the engine's allocator and slot "
            f"mapping pass all your properties. Each line marked - is the engine's, the line "
            f"marked + the mutant's:\n\n{shown}"
        )
