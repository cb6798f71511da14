"""Lesson 08 properties: chained, deterministic block hashes and the prefix lookup.

A block hash names a block's contents for as long as the prefix cache lives, so two things no
single call shows are checked on their own: that different blocks never share an encoding
(`[1, 23]` and `[12, 3]` written as the digits "123" do; a token id past 65535 cut to two
bytes does), and that the hash is the same in another process, whose `PYTHONHASHSEED` differs
(Python's `hash()` of bytes or a str is salted per process).
"""

from __future__ import annotations

import random

from hypothesis import assume, example, given
from hypothesis import strategies as st

from nanovllm.lessons.processes import call_elsewhere, recipe
from nanovllm.lessons.testing import lesson_settings, show_inputs

# Token ids up to 2**31 - 1, past every vocabulary (a hash of 16-bit packed ids would pass
# below 2**16).
token_id = st.one_of(st.integers(0, 50_000), st.integers(0, 2**31 - 1))
tokens = st.lists(token_id, max_size=40)
blocks = st.lists(token_id, min_size=1, max_size=8)
block_sizes = st.sampled_from([1, 2, 3, 4, 8])


@lesson_settings(40)
@given(block=blocks, parent=st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
@show_inputs
def test_hash_is_deterministic_bytes(impl, block, parent):
    """A block's hash is bytes, the same every time, for a list or a tuple of the same tokens."""
    first = impl.hash_block_tokens(parent, block)
    assert isinstance(first, bytes) and len(first) >= 16, "a hash is bytes, at least 16 of them"
    assert impl.hash_block_tokens(parent, list(block)) == first
    assert impl.hash_block_tokens(parent, tuple(block)) == first, "a list or a tuple: same hash"


@lesson_settings(40)
@given(block=blocks, data=st.data())
@show_inputs
def test_every_token_its_order_and_the_parent_count(impl, block, data):
    """Changing one token, their order, or the parent hash changes a block's hash."""
    base = impl.hash_block_tokens(None, block)
    i = data.draw(st.integers(0, len(block) - 1), label="changed position")
    changed = list(block)
    changed[i] += 1
    assert impl.hash_block_tokens(None, changed) != base, "changing one token must change the hash"
    if len(set(block)) > 1:
        assert (
            impl.hash_block_tokens(None, list(reversed(block))) != base or block == block[::-1]
        ), "the same tokens in another order must hash differently"
    parent = impl.hash_block_tokens(None, [7])
    other = impl.hash_block_tokens(None, [8])
    assert impl.hash_block_tokens(parent, block) != base, "a parent must change the hash"
    assert impl.hash_block_tokens(parent, block) != impl.hash_block_tokens(other, block), (
        "different parents must give different hashes"
    )


def _regrouped(block: list[int], cuts: list[int]) -> list[int]:
    """The decimal digits of `block`'s tokens, written one after another, cut into tokens
    again at the positions `cuts` (a cut inside a token's digits makes two tokens of it)."""
    digits = "".join(str(t) for t in block)
    edges = sorted({0, len(digits), *(c % len(digits) for c in cuts)})
    parts = [digits[a:b] for a, b in zip(edges, edges[1:])]
    if any(len(part) > 1 and part.startswith("0") for part in parts):
        return block  # "05" is token 5, whose digits are "5": not the same digits
    return [int(part) for part in parts]


@lesson_settings(40)
@example(block=[1, 23], cuts=[2], wide=False)
@example(block=[12, 3], cuts=[1], wide=False)
@example(block=[5], cuts=[], wide=True)
@given(
    block=st.lists(st.integers(0, 999), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 20), max_size=4),
    wide=st.booleans(),
)
@show_inputs
def test_different_blocks_never_share_an_encoding(impl, block, cuts, wide):
    """Different token lists hash differently even where a careless encoding makes them alike:
    the same decimal digits cut elsewhere ([1, 23] and [12, 3] are both "123"), and token ids
    that agree in their low 16 bits (a vocabulary has 150,000 tokens and more)."""
    other = _regrouped(block, cuts)
    if other != block:
        assert impl.hash_block_tokens(None, block) != impl.hash_block_tokens(None, other), (
            f"{block} and {other} are different blocks with the same hash: their tokens' digits "
            "run together the same; separate the tokens, or encode each in a fixed width"
        )
    if wide:
        far = [t + (1 << 16) for t in block]  # the same low 16 bits
        assert impl.hash_block_tokens(None, block) != impl.hash_block_tokens(None, far), (
            f"{block} and {far} have the same hash: a token id past 65535 is cut to its low "
            "16 bits; real vocabularies have 150,000 tokens and more"
        )


@lesson_settings(40)
@given(token_ids=tokens, block_size=block_sizes)
@show_inputs
def test_one_chained_hash_per_full_block(impl, token_ids, block_size):
    """One hash per full block, each chained to the hash of the block before it."""
    hashes = impl.block_hashes(token_ids, block_size)
    assert len(hashes) == len(token_ids) // block_size, "one hash per FULL block"
    parent = None
    for i, h in enumerate(hashes):
        block = token_ids[i * block_size : (i + 1) * block_size]
        assert h == impl.hash_block_tokens(parent, block), (
            f"block {i} is not chained to block {i - 1}"
        )
        parent = h


@lesson_settings(30)
@given(token_ids=tokens, block_size=block_sizes, data=st.data())
@show_inputs
def test_appending_tokens_never_changes_earlier_hashes(impl, token_ids, block_size, data):
    """Appending tokens never changes the hashes of the blocks already full."""
    k = data.draw(st.integers(0, len(token_ids)), label="prefix length")
    short = impl.block_hashes(token_ids[:k], block_size)
    assert impl.block_hashes(token_ids, block_size)[: len(short)] == short


@lesson_settings(30)
@given(
    token_ids=st.lists(st.integers(0, 99), min_size=8, max_size=40),
    block_size=block_sizes,
    data=st.data(),
)
@show_inputs
def test_a_changed_block_changes_its_hash_and_all_later_ones(impl, token_ids, block_size, data):
    """A changed block changes its own hash and every later block's, even where their tokens are
    equal."""
    num_blocks = len(token_ids) // block_size
    assume(num_blocks >= 2)
    j = data.draw(st.integers(0, num_blocks - 2), label="changed block")
    other = list(token_ids)
    other[j * block_size] += 100  # block j differs; every later block has the same tokens
    a, b = impl.block_hashes(token_ids, block_size), impl.block_hashes(other, block_size)
    assert a[:j] == b[:j], "blocks before the change must keep their hashes"
    for i in range(j, num_blocks):
        assert a[i] != b[i], (
            f"block {i} has the same tokens in both, but block {j} before it differs: its hash "
            "must differ too (it names the whole prefix)"
        )


def _cache_for(impl, prompt, block_size, seed, drop=None):
    """A prefix cache holding `prompt`'s full blocks, in random physical blocks."""
    hashes = impl.block_hashes(prompt, block_size)
    ids = random.Random(seed).sample(range(100), len(hashes))
    cache = {h: b for i, (h, b) in enumerate(zip(hashes, ids)) if i != drop}
    return cache, ids


@lesson_settings(30)
@given(
    prompt=st.lists(st.integers(0, 99), min_size=1, max_size=40),
    block_size=block_sizes,
    seed=st.integers(0, 1000),
    data=st.data(),
)
@show_inputs
def test_reuses_exactly_the_shared_full_blocks(impl, prompt, block_size, seed, data):
    """A new request reuses exactly the cached full blocks it shares, always leaving a token to
    compute."""
    cache, ids = _cache_for(impl, prompt, block_size, seed)
    shared = data.draw(st.integers(0, len(prompt)), label="shared tokens")
    suffix = data.draw(st.lists(st.integers(100, 199), max_size=12), label="new suffix")
    query = prompt[:shared] + suffix  # first differs from the cached prompt at token `shared`
    assume(query)
    expected = ids[: min(shared // block_size, (len(query) - 1) // block_size)]
    got = impl.cached_prefix(query, block_size, cache)
    assert list(got) == expected, (
        f"{shared} tokens shared (blocks of {block_size}, {len(query)} tokens): expected blocks "
        f"{expected}, got {list(got)}"
    )


@lesson_settings(20)
@example(prompt=[5, 6, 7, 8], block_size=2, seed=0)
@given(
    prompt=st.lists(st.integers(0, 99), min_size=1, max_size=40),
    block_size=block_sizes,
    seed=st.integers(0, 1000),
)
@show_inputs
def test_a_prompt_cached_to_its_last_block_end_leaves_a_token(impl, prompt, block_size, seed):
    """A request whose every block is cached, its last block full, still computes its last
    token (the model needs it to give the next token's logits): one block fewer is reused."""
    prompt = prompt[: len(prompt) // block_size * block_size]  # ends at a block's end
    assume(prompt)
    cache, ids = _cache_for(impl, prompt, block_size, seed)
    expected = ids[: (len(prompt) - 1) // block_size]
    got = impl.cached_prefix(prompt, block_size, cache)
    assert list(got) == expected, (
        f"all {len(prompt) // block_size} blocks of the request are cached: reuse "
        f"{len(expected)} of them ({expected}), leaving the last block to compute; got {list(got)}"
    )


@lesson_settings(40)
@given(
    prompt=st.lists(st.integers(0, 99), min_size=2, max_size=40),
    block_size=block_sizes,
    seed=st.integers(0, 1000),
    data=st.data(),
)
@show_inputs
def test_lookup_stops_at_the_first_miss(impl, prompt, block_size, seed, data):
    """The lookup stops at the first block that is not cached, even when later ones are."""
    num_blocks = len(prompt) // block_size
    assume(num_blocks >= 1)
    dropped = data.draw(st.integers(0, num_blocks - 1), label="evicted block")
    cache, ids = _cache_for(impl, prompt, block_size, seed, drop=dropped)
    extended = prompt + [123]  # one more token, so every full block of the prompt may be reused
    got = impl.cached_prefix(extended, block_size, cache)
    assert list(got) == ids[:dropped], (
        f"block {dropped} was evicted: only the blocks before it can be reused"
    )


# Blocks whose hashes another process must agree on: a first block, a chained one, a parent of
# bytes, and a run of blocks.
_FIXED_CALLS = [
    ("hash_block_tokens", (None, [1, 2, 3, 4])),
    ("hash_block_tokens", (bytes(range(32)), [1, 2, 3, 4])),
    ("hash_block_tokens", (b"\x07" * 32, (50_000, 0))),
    ("block_hashes", (list(range(100, 117)), 4)),
]


def test_the_hash_is_the_same_in_another_process(impl):
    """The same blocks hash the same in this process and in two others with other
    PYTHONHASHSEEDs: a block hash names a block's contents, whichever process computed it, and
    Python's own `hash()` of bytes, a str or a tuple is salted per process."""
    here = [getattr(impl, name)(*args) for name, args in _FIXED_CALLS]
    if recipe(impl) is None:  # an implementation built in memory: no other process can build it
        return
    for seed, there in zip((1, 2), call_elsewhere(impl, _FIXED_CALLS, hash_seeds=(1, 2))):
        for (name, args), mine, theirs in zip(_FIXED_CALLS, here, there):
            assert mine == theirs, (
                f"{name}{args!r} differs between this process and one with PYTHONHASHSEED="
                f"{seed}: the hash depends on the process (Python's hash() is salted per "
                "process; use hashlib)"
            )
