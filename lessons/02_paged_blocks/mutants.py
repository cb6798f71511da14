"""Lesson 02 planted bugs: miscounted blocks and misplaced slots."""

from __future__ import annotations

import torch

from nanovllm.lessons.testing import Mutant, variant


def _slot(table, pos, bs):
    return table[pos // bs] * bs + pos % bs


def _with_slot(reference, slot_fn):
    """A variant whose slot_for is `slot_fn` and whose slot_mapping is built from it."""
    return variant(
        reference,
        slot_for=slot_fn,
        slot_mapping=lambda table, start, end, bs: [
            slot_fn(table, p, bs) for p in range(start, end)
        ],
    )


# --- Learner mistakes: wrong solutions written as a learner writes them (issue #52), kept so that
# the properties go on catching them.


def _narrow(dtype: torch.dtype):
    """slot_mapping (and slot_for through it) in tensors of a narrow integer type: the slots
    wrap once they pass that type's largest value."""

    def slot_mapping(block_table, start, end, block_size):
        positions = torch.arange(start, end, dtype=dtype)
        blocks = torch.tensor(block_table, dtype=dtype)
        return (
            blocks[(positions // block_size).long()] * block_size + positions % block_size
        ).tolist()

    def slot_for(block_table, position, block_size):
        return slot_mapping(block_table, position, position + 1, block_size)[0]

    return slot_mapping, slot_for


def _narrow_variant(reference, dtype):
    slot_mapping, slot_for = _narrow(dtype)
    return variant(reference, slot_mapping=slot_mapping, slot_for=slot_for)


MUTANTS = [
    Mutant(
        "floor-blocks",
        "blocks_needed rounds down: the last partial block is forgotten",
        lambda ref: variant(ref, blocks_needed=lambda n, bs: n // bs),
    ),
    Mutant(
        "always-one-more-block",
        "blocks_needed is n // block_size + 1: one too many when n is a multiple",
        lambda ref: variant(ref, blocks_needed=lambda n, bs: n // bs + 1),
    ),
    Mutant(
        "slot-off-by-one",
        "slot_for is one slot too far: block * block_size + offset + 1",
        lambda ref: _with_slot(ref, lambda t, p, bs: _slot(t, p, bs) + 1),
    ),
    Mutant(
        "ignores-block-table",
        "slot_for uses the position as the slot, as if the cache were contiguous",
        lambda ref: _with_slot(ref, lambda t, p, bs: p),
    ),
    Mutant(
        "div-mod-swapped",
        "slot_for looks up block p % block_size at offset p // block_size",
        lambda ref: _with_slot(
            ref, lambda t, p, bs: t[min(p % bs, len(t) - 1)] * bs + (p // bs) % bs
        ),
    ),
    Mutant(
        "position-not-reduced",
        "slot_for adds the whole position, not its offset in the block",
        lambda ref: _with_slot(ref, lambda t, p, bs: t[p // bs] * bs + p),
    ),
    Mutant(
        "slot-mapping-inclusive-end",
        "slot_mapping includes position `end`",
        lambda ref: variant(
            ref,
            slot_mapping=lambda t, s, e, bs: [
                _slot(t, p, bs) for p in range(s, min(e + 1, len(t) * bs))
            ],
        ),
    ),
    Mutant(
        "slot-mapping-stays-in-the-first-block",
        "slot_mapping counts on from start's slot: right within one block, wrong past its end",
        lambda ref: variant(
            ref,
            slot_mapping=lambda t, s, e, bs: [_slot(t, s, bs) + i for i in range(e - s)],
        ),
    ),
    Mutant(
        "slot-mapping-from-zero",
        "slot_mapping starts at position 0 instead of `start`",
        lambda ref: variant(
            ref, slot_mapping=lambda t, s, e, bs: [_slot(t, p, bs) for p in range(e - s)]
        ),
    ),
    Mutant(
        "learner-int16-slots",
        "slots computed in int16 tensors: they wrap past 32,767",
        lambda ref: _narrow_variant(ref, torch.int16),
    ),
    Mutant(
        "learner-int32-slots",
        "slots computed in int32 tensors (the engine's block-table type): they wrap past 2^31",
        lambda ref: _narrow_variant(ref, torch.int32),
    ),
]
