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


@st.composite
def sequences(draw) -> Sequence:
    """A sequence scattered over a pool of blocks."""
    block_size = draw(block_sizes, label="block_size")
    seq_len = draw(st.integers(1, 70), label="seq_len")
    num_blocks = -(-seq_len // block_size)
    pool = num_blocks + draw(st.integers(0, 4))
    table = scattered_table(draw(seeds, label="seed"), num_blocks, pool)
    return Sequence(block_size, seq_len, table)


@lesson_settings(30)
@given(num_tokens=st.integers(0, 200), block_size=block_sizes)
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
    block_size."""
    block_size, seq_len, table = seq
    pos = data.draw(st.integers(0, seq_len - 1), label="position")
    slot = impl.slot_for(table, pos, block_size)
    block, offset = divmod(slot, block_size)
    assert block == table[pos // block_size], (
        f"position {pos} is in logical block {pos // block_size} = physical block "
        f"{table[pos // block_size]}, but slot {slot} is in block {block}"
    )
    assert offset == pos % block_size, f"position {pos} must be at offset {pos % block_size}"


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
    """slot_mapping(start, end) is slot_for of start, ..., end-1, in that order."""
    block_size, seq_len, table = seq
    start = data.draw(st.integers(0, seq_len - 1), label="start")
    end = data.draw(st.integers(start + 1, seq_len), label="end")
    slots = impl.slot_mapping(table, start, end, block_size)
    expected = [impl.slot_for(table, p, block_size) for p in range(start, end)]
    assert list(slots) == expected, "slot_mapping must be slot_for of start..end-1, in order"
    assert all(divmod(s, block_size)[0] in table for s in slots)
