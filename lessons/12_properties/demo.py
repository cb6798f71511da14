"""Lesson 12 demo: hypothesis hunting two planted bugs, and shrinking what it finds.

A good property is run against the engine (it holds) and against an allocator that leaks one block
whenever a request is freed, and a slot mapping that is one off. hypothesis searches for a failing
script, then shrinks it to the smallest one that still fails: that is the bug report.

Run it: `nanovllm lesson 12 --demo` (or `python demo.py`).
"""

from __future__ import annotations

from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from rich.console import Console

from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.lessons.scripts import AllocatorCase, run_allocator_script


class LeakyManager(KVCacheManager):
    """Frees all of a request's blocks but its last one."""

    def free(self, request):
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks:
            blocks.pop()
        super().free(request)


def conservation_holds(make_manager, case: AllocatorCase) -> bool:
    """The property: after every operation, free blocks + owned blocks == all blocks."""
    manager = make_manager(case.num_blocks, case.block_size)
    for snap in run_allocator_script(manager, case.script):
        owned = sum(len(t) for t in snap.tables.values())
        if manager.num_free_blocks + owned != case.num_blocks:
            return False
    return True


cases = st.builds(
    AllocatorCase,
    num_blocks=st.integers(2, 10),
    block_size=st.sampled_from([1, 2, 4]),
    script=st.lists(
        st.one_of(
            st.tuples(st.just("allocate"), st.sampled_from("abc"), st.integers(1, 8)),
            st.tuples(st.just("free"), st.sampled_from("abc")),
        ),
        max_size=25,
    ).map(tuple),
)
quiet = settings(max_examples=300, database=None, suppress_health_check=list(HealthCheck))


def run(console: Console) -> None:
    engine = lambda n, b: KVCacheManager(n, b, False)  # noqa: E731
    leaky = lambda n, b: LeakyManager(n, b, False)  # noqa: E731

    tried = {"n": 0}

    def engine_fails(case):
        tried["n"] += 1
        return not conservation_holds(engine, case)

    try:
        find(cases, engine_fails, settings=settings(quiet, max_examples=150))
        console.print("[red]The property fails on the engine: a false alarm![/]")
    except Exception:  # hypothesis.errors.NoSuchExample: no failing case exists among those tried
        console.print(f"The engine: conservation held on all {tried['n']} generated scripts.")

    tried["n"] = 0

    def leaky_fails(case):
        tried["n"] += 1
        return not conservation_holds(leaky, case)

    smallest = find(cases, leaky_fails, settings=quiet)
    console.print(
        f"The leaky allocator: hypothesis found a failing script among its first examples, then "
        f"shrank it ({tried['n']} runs in all) to:\n"
    )
    console.print(
        f"  AllocatorCase(num_blocks={smallest.num_blocks}, block_size={smallest.block_size},"
    )
    console.print(f"                script={list(smallest.script)})")
    console.print(
        "\nAllocate one token for a request, free it: one block is gone for good. Nothing "
        "smaller shows the bug, and nothing in it is noise.\n"
    )

    def slot_for(table, pos, bs):  # one slot too far
        return table[pos // bs] * bs + pos % bs + 1

    def slots_wrong(args):
        table, bs = args
        return any(
            divmod(slot_for(table, p, bs), bs) != (table[p // bs], p % bs)
            for p in range(len(table) * bs)
        )

    tables = st.tuples(
        st.lists(st.integers(0, 20), min_size=1, max_size=5, unique=True),
        st.sampled_from([1, 2, 4, 8]),
    )
    table, bs = find(tables, slots_wrong, settings=quiet)
    console.print(
        f"The off-by-one slot mapping, shrunk: block_table={table}, block_size={bs}. Position 0 "
        f"goes to slot {slot_for(table, 0, bs)}, which is not in block {table[0]}."
    )


if __name__ == "__main__":
    run(Console())
