"""Lesson 02 exercise: blocks, block tables and slots.

Plain integers, no tensors. A block table is a list of physical block ids: logical block i of the
sequence lives in physical block `block_table[i]`. Check with `nanovllm lesson 2 --check`.
"""

from __future__ import annotations


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """The number of blocks a sequence of `num_tokens` tokens occupies: ceil(num_tokens /
    block_size). 0 tokens need 0 blocks; 1..block_size tokens need 1; and so on."""
    raise NotImplementedError("write blocks_needed (lesson 02)")


def slot_for(block_table: list[int], position: int, block_size: int) -> int:
    """The cache slot of the token at `position` of a sequence.

    The token lives in logical block `position // block_size`, i.e. physical block
    `block_table[position // block_size]`, at offset `position % block_size` inside it; the pool's
    slots are numbered block by block, `block_size` per block.
    """
    raise NotImplementedError("write slot_for (lesson 02)")


def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """The slots of positions start, start+1, ..., end-1 (the tokens a step computes), in order.

    The block table is long enough for position end-1.
    """
    raise NotImplementedError("write slot_mapping (lesson 02)")
