"""The lessons' plug points build what the engine builds (`lessons/plug.py`).

Oracle: the engine's own step builder, `step_inputs` (executor/step_inputs.py), on the same
step.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from nanovllm.core.scheduler import ScheduledRequest, SchedulerOutput
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.lessons.catalog import get_lesson
from nanovllm.lessons.harness import implementation
from nanovllm.lessons.plug import your_step_inputs
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams


@given(
    steps=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 39)), min_size=1, max_size=6
    ),  # (context length after the step, tokens computed before it)
    block_size=st.sampled_from([1, 4, 16]),
)
def test_lesson_09s_step_inputs_are_the_engines_for_tuple_block_tables(steps, block_size):
    """Lesson 09's reference `prepare_inputs`, plugged in as the part `step_inputs`, gives the
    engine's own step inputs. The scheduler hands block tables out as tuples (lesson 09's
    `--run` once failed on them: "can only concatenate tuple (not list) to tuple")."""
    out = SchedulerOutput(step=1)
    next_block = 0
    for i, (seq_len, computed) in enumerate(steps):
        computed = min(computed, seq_len - 1)
        num_blocks = -(-seq_len // block_size)
        request = Request(f"r{i}", list(range(seq_len)), SamplingParams(), arrival_index=i)
        table = tuple(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        new = seq_len - computed
        out.scheduled.append(
            ScheduledRequest(request, new, computed, table, samples=True, is_prefill=new > 1)
        )
    impl = implementation(get_lesson(9), "reference")
    want = step_inputs(out, block_size)
    got = your_step_inputs(impl)(out, block_size)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[3] == want[3]
    for name, tensor in want[2].tensors().items():
        assert torch.equal(getattr(got[2], name), tensor), name
    for name in ("seq_lens_list", "query_lens_list", "query_start_list", "prefill_seq_indices"):
        assert getattr(got[2], name) == getattr(want[2], name), name
