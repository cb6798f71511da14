"""The lessons' plug points build what the engine builds (`lessons/plug.py`).

Oracle: the engine's own step builder, `step_metadata` (executor/step_inputs.py), on the same
step.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from nanovllm.executor.step_inputs import step_metadata
from nanovllm.lessons.plug import metadata_from


@given(
    steps=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 39)), min_size=1, max_size=6
    ),  # (context length after the step, tokens computed before it)
    block_size=st.sampled_from([1, 4, 16]),
)
def test_metadata_from_lists_equals_the_engines_for_tuple_block_tables(steps, block_size):
    """The scheduler hands block tables out as tuples (lesson 09's `--run` once failed on
    them: "can only concatenate tuple (not list) to tuple")."""
    positions, query_lens, seq_lens, tables = [], [], [], []
    next_block = 0
    for seq_len, computed in steps:
        computed = min(computed, seq_len - 1)
        num_blocks = -(-seq_len // block_size)
        tables.append(tuple(range(next_block, next_block + num_blocks)))
        next_block += num_blocks
        positions.extend(range(computed, seq_len))
        query_lens.append(seq_len - computed)
        seq_lens.append(seq_len)
    _, want = step_metadata(positions, query_lens, seq_lens, tables, block_size)
    got = metadata_from(
        want.slot_mapping.tolist(),
        want.query_start_loc.tolist(),
        seq_lens,
        tables,
        torch.device("cpu"),
    )
    for name, tensor in want.tensors().items():
        assert torch.equal(getattr(got, name), tensor.to(getattr(got, name).dtype)), name
    assert got.prefill_seq_indices == want.prefill_seq_indices
    assert got.query_lens_list == want.query_lens_list
