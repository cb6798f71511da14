"""Lesson 16 properties: a sliding window's blocks leave as it passes; a hit needs one window.

The oracle is the rule itself, written out here in a few lines, never the code under test:

- skipped tokens: `max(n - sliding_window + 1, 0)` after `n` computed tokens;
- the blocks freed: block i once `(i + 1) * block_size <= skipped`, each once, the latest
  first (so the free queue's tail gets them in falling logical order), the null block in its
  place in the table, `num_null_blocks` counting it; a block another request also holds stays
  out of the free queue (its count drops by one);
- a hit of L blocks: the largest L <= max_length // block_size whose last
  ceil((sliding_window - 1) / block_size) blocks (or all L, if fewer) are cached, the blocks
  before them null.

Every property builds a fresh block pool with its null block and drives the manager the way
the engine's `KVCacheCoordinator` does. Block sizes, windows, group ids and lengths are drawn
so that a window's start falls on a block boundary, one token before it and one after, often.
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.core.block_hash import extend_block_hashes, hash_with_group_id
from nanovllm.core.block_pool import BlockPool
from nanovllm.core.kv_cache_interface import SlidingWindowSpec
from nanovllm.events import BlockFreed, EventBus
from nanovllm.lessons.testing import lesson_settings, show_inputs
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

block_sizes = st.sampled_from([1, 2, 3, 4, 8, 16])


class Moves(NamedTuple):
    """A request's table and the computed counts `remove_skipped_blocks` is called with."""

    block_size: int
    sliding_window: int
    num_tokens: int  # the table holds blocks for this many tokens
    num_null: int  # its first blocks, null from a prefix hit
    num_shared: int  # its next real blocks, also held by another request
    calls: list[int]  # num_computed_tokens of each call, rising


class CachedPrompt(NamedTuple):
    """A new request's tokens, which of its full blocks are cached, and the lookup's bounds."""

    block_size: int
    sliding_window: int
    tokens: list[int]
    cached: list[bool]  # per full block
    held: list[bool]  # per full block: a cached block still held by a request (else free)
    max_length: int
    group_id: int


@st.composite
def windows(draw, block_size: int) -> int:
    """A window of 1 token up to a few blocks, near a multiple of the block size half the
    time (where `sliding_window - 1` is one: a hit's blocks round up or down)."""
    k = draw(st.integers(0, 4))
    near = draw(st.sampled_from([-1, 0, 1, 2]))
    return draw(
        st.one_of(st.integers(1, 5 * block_size + 2), st.just(max(k * block_size + near, 1)))
    )


def _manager(impl, block_size: int, sliding_window: int, num_blocks: int, group_id: int = 0):
    pool = BlockPool(num_blocks + 1, EventBus(), with_null_block=True)  # (+1: the null block)
    spec = SlidingWindowSpec(block_size, sliding_window)
    return impl.SlidingWindowManager(spec, pool, group_id, EventBus()), pool


def _free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def _ids(blocks, null) -> list[str]:
    return ["null" if b is null else str(b.block_id) for b in blocks]


def _skipped(n: int, sliding_window: int) -> int:
    return max(n - sliding_window + 1, 0)


# --- get_num_skipped_tokens ---------------------------------------------------------------------


@lesson_settings(30)
@example(block_size=4, sliding_window=1, num_computed_tokens=0)
@example(block_size=4, sliding_window=8, num_computed_tokens=7)
@example(block_size=4, sliding_window=8, num_computed_tokens=8)
@given(
    block_size=block_sizes,
    sliding_window=st.one_of(st.integers(1, 64), st.integers(1, 2**31)),
    num_computed_tokens=st.one_of(st.integers(0, 80), st.integers(0, 2**40)),
)
@show_inputs
def test_skipped_tokens_are_those_before_the_next_querys_window(
    impl, block_size, sliding_window, num_computed_tokens
):
    """After n computed tokens the next query is at position n and sees n - sliding_window + 1
    .. n: the max(n - sliding_window + 1, 0) tokens before are skipped."""
    manager, _ = _manager(impl, block_size, sliding_window, 2)
    got = manager.get_num_skipped_tokens(num_computed_tokens)
    want = _skipped(num_computed_tokens, sliding_window)
    assert got == want, (
        f"window {sliding_window}, {num_computed_tokens} tokens computed: the next query is at "
        f"position {num_computed_tokens} and sees from position {num_computed_tokens - sliding_window + 1}"
        f", so {want} tokens are skipped; got {got}"
    )


# --- remove_skipped_blocks ----------------------------------------------------------------------


@st.composite
def moving_windows(draw):
    """A request's table of `num_tokens` tokens (after `num_null` null blocks from a prefix
    hit), the first `num_shared` of its real blocks also held by another request, and the
    computed counts it is called with, rising (chunks, decode steps, block ends)."""
    block_size = draw(block_sizes, label="block_size")
    sliding_window = draw(windows(block_size), label="sliding_window")
    num_blocks = draw(st.integers(1, 10), label="num_blocks")
    num_tokens = draw(
        st.integers((num_blocks - 1) * block_size + 1, num_blocks * block_size), label="num_tokens"
    )
    num_null = draw(st.sampled_from([0, 0, 0, 1, 2]), label="num_null")
    num_null = min(num_null, num_blocks - 1)
    num_shared = draw(st.integers(0, num_blocks - num_null), label="num_shared")
    lo = num_null * block_size
    points = draw(st.lists(st.integers(lo, num_tokens), min_size=1, max_size=8), label="calls")
    # Block ends and a window past one, where an off-by-one shows.
    edges = [
        min(max(k * block_size + sliding_window - 1 + d, lo), num_tokens)
        for k in range(num_blocks + 1)
        for d in (-1, 0)
    ]
    if draw(st.booleans(), label="at the edges"):
        points += draw(st.lists(st.sampled_from(edges), max_size=6))
    return Moves(block_size, sliding_window, num_tokens, num_null, num_shared, sorted(points))


@lesson_settings(30)
@example(case=Moves(4, 8, 16, 0, 0, [7, 8, 11, 12, 16]))
@example(case=Moves(4, 5, 20, 0, 2, [8, 12, 20]))
@example(case=Moves(2, 3, 12, 2, 1, [4, 6, 9, 12]))
@given(case=moving_windows())
@show_inputs
def test_blocks_behind_the_window_go_back_latest_first(impl, case):
    """As the window moves, exactly the blocks wholly behind it are freed, each once, the
    latest first; the null block takes each one's place in the table, and a block another
    request still holds stays out of the free queue."""
    block_size, sliding_window, num_tokens, num_null, num_shared, calls = case
    num_blocks = -(-num_tokens // block_size)
    manager, pool = _manager(impl, block_size, sliding_window, num_blocks + 2)
    null = pool.null_block
    seen: list = []  # the events a visualizer is told
    # The request's table: null blocks from a prefix hit, then blocks taken for its tokens.
    manager.save_new_computed_blocks("r", [null] * num_null)
    manager.allocate_new_blocks("r", num_tokens)
    table = list(manager.req_to_blocks["r"])
    manager.save_new_computed_blocks("other", table[num_null : num_null + num_shared])
    free_queue = _free_ids(pool)  # what the oracle expects the free queue to be
    manager.events.subscribe(seen.append)
    num_gone = num_null  # blocks already null (a prefix of the table)
    for n in calls:
        gone = max(num_gone, min(_skipped(n, sliding_window) // block_size, num_blocks))
        freed_now = range(gone - 1, num_gone - 1, -1)  # logical indexes, the latest first
        free_queue += [table[i].block_id for i in freed_now if i >= num_null + num_shared]
        expected = [null] * gone + table[gone:]
        seen.clear()
        returned = manager.remove_skipped_blocks("r", n)
        got = manager.req_to_blocks["r"]
        where = (
            f"window {sliding_window}, blocks of {block_size}, table of {num_blocks} blocks, "
            f"called with num_computed_tokens={n}"
        )
        assert [b is e for b, e in zip(got, expected)] == [True] * num_blocks and len(got) == len(
            expected
        ), (
            f"{where}: the table should be {_ids(expected, null)}, the first "
            f"{_skipped(n, sliding_window)} tokens skipped, so only blocks wholly among them null; "
            f"it is {_ids(got, null)}"
        )
        assert returned is bool(freed_now), (
            f"{where}: {len(freed_now)} blocks freed by this call, so it returns "
            f"{bool(freed_now)}; it returned {returned!r}"
        )
        assert _free_ids(pool) == free_queue, (
            f"{where}: the free queue should end {free_queue[-6:]} (freed the latest first, a "
            f"block another request holds not at all); it ends {_free_ids(pool)[-6:]}"
        )
        for i, block in enumerate(table[num_null:], start=num_null):
            held = (i >= gone) + (i < num_null + num_shared)
            assert block.ref_cnt == held, (
                f"{where}: block {block.block_id} (logical {i}) is held by {held} request(s); "
                f"its ref_cnt is {block.ref_cnt} (give a block back with self.free_block, once)"
            )
        told = [(e.request_id, e.block_id) for e in seen if isinstance(e, BlockFreed)]
        assert told == [("r", table[i].block_id) for i in freed_now], (
            f"{where}: the events told {told}, each block freed by request 'r' the latest first "
            "(free each with self.free_block(request_id, block), which tells them)"
        )
        assert manager.num_null_blocks == gone, (
            f"{where}: the table holds {gone} null blocks, num_null_blocks says "
            f"{manager.num_null_blocks} (count one more for each null block put in)"
        )
        assert null.ref_cnt == 0 and null.block_id not in _free_ids(pool), (
            f"{where}: the null block was given back to the pool; it is no one's block"
        )
        num_gone = gone


@lesson_settings(10)
@example(block_size=4, sliding_window=2, num_computed_tokens=40, has_table=False)
@given(
    block_size=block_sizes,
    sliding_window=st.integers(1, 40),
    num_computed_tokens=st.integers(0, 200),
    has_table=st.booleans(),
)
@show_inputs
def test_a_request_without_blocks_frees_nothing(
    impl, block_size, sliding_window, num_computed_tokens, has_table
):
    """A request with no blocks yet (a new one whose computed tokens are a prefix-cache hit
    still to be saved) frees nothing and returns False, whatever its computed count."""
    manager, pool = _manager(impl, block_size, sliding_window, 4)
    if has_table:
        manager.req_to_blocks["r"] = []
    before = _free_ids(pool)
    returned = manager.remove_skipped_blocks("r", num_computed_tokens)
    assert returned is False, f"nothing was freed, so it returns False; it returned {returned!r}"
    assert _free_ids(pool) == before and manager.num_null_blocks == 0, "nothing may change"
    assert manager.req_to_blocks.get("r", []) == [], "the request has no blocks to replace"


# --- find_longest_cache_hit ---------------------------------------------------------------------


@st.composite
def cached_prompts(draw):
    """A request's tokens, its full blocks' hashes, which of those blocks are cached (in use
    or free), the group its manager is, and the lookup's max_length."""
    block_size = draw(block_sizes, label="block_size")
    sliding_window = draw(windows(block_size), label="sliding_window")
    num_full = draw(st.integers(0, 10), label="full blocks")
    extra = draw(st.integers(0, block_size - 1), label="tokens past them")
    tokens = draw(
        st.lists(st.integers(0, 99), min_size=num_full * block_size + extra,
                 max_size=num_full * block_size + extra),
        label="tokens",
    )  # fmt: skip
    pattern = draw(st.sampled_from(["random", "gap", "tail"]), label="pattern")
    if pattern == "random":
        cached = draw(st.lists(st.booleans(), min_size=num_full, max_size=num_full))
    else:  # one run of misses (an evicted stretch), or every block but the last few
        a = draw(st.integers(0, num_full))
        b = draw(st.integers(a, num_full))
        cached = [not (a <= i < b) for i in range(num_full)]
        if pattern == "tail":
            cached = [i >= a for i in range(num_full)]
    held = draw(st.lists(st.booleans(), min_size=num_full, max_size=num_full), label="held")
    max_length = draw(
        st.one_of(
            st.just(len(tokens)), st.just(max(len(tokens) - 1, 0)), st.integers(0, len(tokens))
        ),
        label="max_length",
    )
    group_id = draw(st.sampled_from([0, 0, 1, 2]), label="group_id")
    return CachedPrompt(block_size, sliding_window, tokens, cached, held, max_length, group_id)


def _longest_hit(cached: list[bool], num_needed: int, max_blocks: int) -> int:
    """The longest L <= max_blocks whose last `num_needed` blocks (all, if fewer) are cached."""
    return max(L for L in range(max_blocks + 1) if all(cached[max(L - num_needed, 0) : L]))


@lesson_settings(40)
@example(
    case=CachedPrompt(4, 9, list(range(20)), [False, True, True, True, False], [False] * 5, 20, 0)
)
@example(case=CachedPrompt(4, 8, list(range(16)), [False, True, True, False], [False] * 4, 16, 1))
@example(case=CachedPrompt(4, 5, list(range(12)), [True, False, True], [True, False, False], 12, 0))
@example(case=CachedPrompt(2, 1, list(range(8)), [False, False, True, False], [False] * 4, 7, 0))
@given(case=cached_prompts())
@show_inputs
def test_a_hit_needs_only_the_last_windows_blocks(impl, case):
    """A hit is as long as can be, its last ceil((sliding_window - 1) / block_size) blocks
    cached and the ones before them null; looking changes nothing."""
    block_size, sliding_window, tokens, cached, held, max_length, group_id = case
    num_full = len(cached)
    manager, pool = _manager(impl, block_size, sliding_window, num_full + 2, group_id)
    null = pool.null_block
    request = Request("new", list(tokens), SamplingParams(), arrival_index=0)
    hashes: list[bytes] = []
    extend_block_hashes(hashes, list(tokens), block_size, len(tokens))
    blocks = {}  # logical index -> the cached block holding it
    for i in (i for i in range(num_full) if cached[i]):
        block = pool.get_new_block()
        key = hash_with_group_id(hashes[i], group_id)
        pool.cache_block(block, key, tuple(tokens[i * block_size : (i + 1) * block_size]))
        blocks[i] = block
    for i, block in blocks.items():
        if not held[i]:
            pool.free_block(block)  # free, still cached: a hit takes it back
    before = (
        _free_ids(pool),
        [b.ref_cnt for b in pool.blocks],
        dict(pool.cached_block_hash_to_block),
    )

    num_needed = -(-(sliding_window - 1) // block_size)
    length = _longest_hit(cached, num_needed, max_length // block_size)
    expected = [null if i < length - num_needed else blocks[i] for i in range(length)]
    hashes_given, tokens_given = list(hashes), list(request.all_token_ids)
    got = manager.find_longest_cache_hit(request, hashes, max_length)
    assert hashes == hashes_given and list(request.all_token_ids) == tokens_given, (
        "find_longest_cache_hit changed the block hashes or the request's tokens it was given"
    )
    shown = "".join("C" if c else "." for c in cached)
    assert len(got) == length and all(g is e for g, e in zip(got, expected)), (
        f"window {sliding_window}, blocks of {block_size} (C cached, . not: {shown}), "
        f"max_length {max_length}: the token after a hit sees the {sliding_window - 1} before "
        f"it, so the hit's last {num_needed} blocks must be cached; expected "
        f"{_ids(expected, null)}, got {_ids(got, null)}"
    )
    after = (
        _free_ids(pool),
        [b.ref_cnt for b in pool.blocks],
        dict(pool.cached_block_hash_to_block),
    )
    assert after == before, "a lookup changes nothing: no block taken, freed or uncached"
    assert manager.req_to_blocks == {} and manager.num_null_blocks == 0, (
        "a lookup changes no block table (the coordinator saves the hit later)"
    )
