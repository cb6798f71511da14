"""Lesson 02 properties: block counts are minimal, and slots land where the block table says."""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import given
from hypothesis import strategies as st

from nanovllm.lessons.strategies import scattered_table, seeds
from nanovllm.lessons.testing import lesson_settings, show_inputs

block_sizes = st.sampled_from([1, 2, 3, 4, 8, 16])


class Sequence(NamedTuple):
    block_size: int
    seq_len: int
    block_table: list[int]


# How far the slot numbers reach: a small pool, one past 2^15 slots (a 16-bit integer wraps),
# and one past 2^31 (a 32-bit one wraps; the engine's block ids are int32, its slots int64).
POOL_SIZES = {"small": None, "past 2^15": 2**16, "past 2^31": 2**31 - 1}


@st.composite
def sequences(draw, max_len: int = 70) -> Sequence:
    """A sequence scattered over a pool of blocks, small or with block ids in the billions."""
    block_size = draw(block_sizes, label="block_size")
    seq_len = draw(st.integers(1, max_len), label="seq_len")
    num_blocks = -(-seq_len // block_size)
    reach = draw(st.sampled_from(sorted(POOL_SIZES)), label="pool")
    pool = POOL_SIZES[reach] or num_blocks + draw(st.integers(0, 4))
    table = scattered_table(draw(seeds, label="seed"), num_blocks, pool)
    return Sequence(block_size, seq_len, table)


def _slot(table: list[int], position: int, block_size: int) -> int:
    """The oracle: physical block times block_size, plus the offset in the block."""
    return table[position // block_size] * block_size + position % block_size


@lesson_settings(30)
@given(
    num_tokens=st.integers(0, 200),
    block_size=block_sizes,
)
@show_inputs
def test_blocks_needed_is_the_fewest_that_fit(impl, num_tokens, block_size):
    """blocks_needed is ceil(num_tokens / block_size): enough blocks, and not one more."""
    n = impl.blocks_needed(num_tokens, block_size)
    assert n * block_size >= num_tokens, (
        f"{n} blocks of {block_size} cannot hold {num_tokens} tokens"
    )
    assert n == 0 or (n - 1) * block_size < num_tokens, f"{n} blocks: one fewer would do"


@lesson_settings(30)
@given(seq=sequences(), data=st.data())
@show_inputs
def test_slot_is_in_the_right_block_at_the_right_offset(impl, seq, data):
    """A position's slot is in the physical block its block table names, at offset position %
    block_size, however large the block ids; the block table is left as it was."""
    block_size, seq_len, table = seq
    pos = data.draw(st.integers(0, seq_len - 1), label="position")
    given = list(table)
    slot = impl.slot_for(table, pos, block_size)
    assert table == given, "slot_for changed the caller's block table"
    block, offset = divmod(slot, block_size)
    assert block == table[pos // block_size], (
        f"position {pos} is in logical block {pos // block_size} = physical block "
        f"{table[pos // block_size]}, but slot {slot} is in block {block}"
    )
    assert offset == pos % block_size, f"position {pos} must be at offset {pos % block_size}"
    assert slot == _slot(table, pos, block_size)


@lesson_settings(30)
@given(seq=sequences())
@show_inputs
def test_no_two_positions_share_a_slot(impl, seq):
    """Every position of a sequence has a slot of its own: no two tokens overwrite each other's
    K/V."""
    block_size, seq_len, table = seq
    slots = [impl.slot_for(table, p, block_size) for p in range(seq_len)]
    assert len(set(slots)) == seq_len, "two tokens would overwrite each other's K/V"


@lesson_settings(30)
@given(block_size=block_sizes, seq_len=st.integers(1, 60))
@show_inputs
def test_contiguous_table_means_slot_equals_position(impl, block_size, seq_len):
    """With the block table [0, 1, 2, ...] the slot of a position is the position itself."""
    table = list(range(-(-seq_len // block_size)))
    assert [impl.slot_for(table, p, block_size) for p in range(seq_len)] == list(range(seq_len))


@lesson_settings(30)
@given(seq=sequences(), data=st.data())
@show_inputs
def test_slot_mapping_covers_exactly_the_new_tokens(impl, seq, data):
    """slot_mapping(start, end) is the slots of start, ..., end-1, in that order (none when
    start == end); the block table is left as it was."""
    block_size, seq_len, table = seq
    start = data.draw(st.integers(0, seq_len), label="start")
    end = data.draw(st.integers(start, seq_len), label="end")
    expected = [_slot(table, p, block_size) for p in range(start, end)]
    given = list(table)
    slots = impl.slot_mapping(table, start, end, block_size)
    assert table == given, "slot_mapping changed the caller's block table"
    got = [int(s) for s in slots]
    assert len(got) == len(expected), (
        f"slot_mapping({start}, {end}) gave {len(got)} slots for {len(expected)} positions"
    )
    for position, slot, want in zip(range(start, end), got, expected):
        assert slot == want, f"slot_mapping put position {position} in slot {slot}, not {want}"


@lesson_settings(10)
@given(block_size=st.sampled_from([8, 16]), data=st.data())
@show_inputs
def test_positions_past_2_15(impl, block_size, data):
    """Positions past 32,767 (a long context) get their slots like any other."""
    position = data.draw(st.integers(2**15 - 8, 2**16), label="position")
    table = list(range(position // block_size + 1))[::-1]  # blocks in reverse order
    expected = _slot(table, position, block_size)
    assert impl.slot_for(table, position, block_size) == expected
    assert [int(s) for s in impl.slot_mapping(table, position, position + 1, block_size)] == [
        expected
    ]
