"""The persistent batch (`InputBatch`) against its plain reference (`step_inputs`).

Over a random run of steps, the block tables change the ways the engine changes them (a block
appended, rejected proposals' blocks given back, a preempted request back with other blocks, a
request leaving and a new one reusing its id, requests skipping a step), and on every step the
persistent batch must give exactly the tensors `step_inputs` builds from scratch.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.backends.input_batch import InputBatch
from nanovllm.core.scheduler import ScheduledRequest, SchedulerOutput
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.models.attention import AttentionMetadata
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

NUM_BLOCKS = 40


def assert_same_inputs(got: tuple, want: tuple) -> None:
    (ids, positions, meta, rows), (want_ids, want_positions, want_meta, want_rows) = got, want
    assert rows == want_rows
    for name, a, b in [("input_ids", ids, want_ids), ("positions", positions, want_positions)]:
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert isinstance(meta, AttentionMetadata)
    for name, value in vars(want_meta).items():
        mine = getattr(meta, name)
        if isinstance(value, torch.Tensor):
            assert mine.dtype == value.dtype and torch.equal(mine, value), name
        else:
            assert mine == value, name


@st.composite
def table_change(draw, table: list[int]) -> list[int]:
    """The next block table of a request that had `table`: as the engine changes them."""
    kind = draw(st.sampled_from(["same", "same", "append", "shrink", "replace_tail", "new"]))
    block = st.integers(0, NUM_BLOCKS - 1)
    if kind == "same" and table:
        return list(table)
    if kind == "append" and table:
        return table + draw(st.lists(block, min_size=1, max_size=3))
    if kind == "shrink" and len(table) > 1:  # rejected proposals give blocks back
        return table[: draw(st.integers(1, len(table) - 1))]
    if kind == "replace_tail" and table:  # given back, then other blocks taken: same length
        keep = draw(st.integers(0, len(table) - 1))
        size = len(table) - keep
        return table[:keep] + draw(st.lists(block, min_size=size, max_size=size))
    return draw(st.lists(block, min_size=1, max_size=6))  # new, or back after preemption


@st.composite
def scheduled_request(draw, request_id: str, table: list[int], block_size: int):
    """One request's part of a step whose context fits `table`."""
    capacity = len(table) * block_size
    seq_len = draw(st.integers(1, min(capacity, 80)))
    num_new = draw(st.integers(1, seq_len))
    num_spec = draw(st.integers(0, min(num_new - 1, 3)))
    num_tokens = seq_len - num_spec  # the request's own tokens (proposals come after them)
    samples = draw(st.booleans()) or num_spec > 0
    if not samples:  # a prefill chunk ends before the last known token
        num_tokens = draw(st.integers(seq_len, seq_len + 5))
    tokens = random.Random(draw(st.integers(0, 2**16))).choices(range(1000), k=num_tokens)
    request = Request(request_id, tokens, SamplingParams(), arrival_index=0)
    return ScheduledRequest(
        request,
        num_new,
        seq_len - num_new,
        (table,),
        samples,
        is_prefill=num_new - num_spec > 1,
        to_verify=draw(st.lists(st.integers(0, 999), min_size=num_spec, max_size=num_spec)),
    )


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), block_size=st.sampled_from([1, 2, 4, 16]))
def test_persistent_batch_equals_building_from_scratch(data, block_size) -> None:
    # A small batch to start with, so that rows and columns grow during the run.
    batch = InputBatch(block_size, max_num_seqs=2, max_blocks_per_seq=2)
    tables: dict[str, list[int]] = {}
    for step in range(data.draw(st.integers(1, 12))):
        ids = data.draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True))
        scheduled = []
        for request_id in ids:
            tables[request_id] = data.draw(table_change(tables.get(request_id, [])))
            scheduled.append(
                data.draw(scheduled_request(request_id, tables[request_id], block_size))
            )
        out = SchedulerOutput(step=step, scheduled=scheduled)
        assert_same_inputs(batch.prepare(out), step_inputs(out, block_size))
        # The invariant itself: each scheduled request's row holds its table, zero-padded.
        for s in scheduled:
            row = batch.block_table[batch.row_of[s.request.request_id]]
            n = len(s.block_table)
            assert row[:n].tolist() == s.block_table and not row[n:].any()
        assert len(batch.row_of) == len(scheduled)  # the others' rows were given back


def test_a_decode_step_writes_only_the_appended_block() -> None:
    """The point of keeping the rows: an unchanged table is not written again."""
    batch = InputBatch(block_size=4)

    def step(table: list[int], num_computed: int) -> SchedulerOutput:
        request = Request("r", list(range(num_computed + 1)), SamplingParams(), 0)
        return SchedulerOutput(
            1, [ScheduledRequest(request, 1, num_computed, (table,), True, False)]
        )

    batch.prepare(step([7, 3], 6))
    row = batch.row_of["r"]
    batch.block_table[row, 0] = -1  # a write of the whole table would restore it
    _, _, meta, _ = batch.prepare(step([7, 3, 9], 8))
    assert batch.block_table[row, :3].tolist() == [-1, 3, 9]
    assert meta.slot_mapping.tolist() == [9 * 4 + 0]
    assert np.array_equal(meta.block_tables.numpy(), [[-1, 3, 9]])


def test_a_block_table_too_short_for_its_positions_is_an_error() -> None:
    """The zero padding must not send a token past its table to block 0 in silence."""
    batch = InputBatch(block_size=4)
    request = Request("short", list(range(9)), SamplingParams(), 0)
    out = SchedulerOutput(1, [ScheduledRequest(request, 9, 0, ([5, 6],), True, True)])
    with pytest.raises(ValueError, match=r"'short': position 8 needs block 2 .* has 2 blocks"):
        batch.prepare(out)
