"""The lessons' plug points build what the engine builds (`lessons/plug.py`), and a lesson
asks its parts, not the engine's insides, what they built.

Oracle: the engine's own step builder, `step_inputs` (executor/step_inputs.py), on the same
step; for the kept parts, what the test had them build.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nanovllm.core.scheduler import ScheduledRequest, SchedulerOutput
from nanovllm.engine.parts import EngineParts
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.kv_transfer.host_tier import HostBlockTier
from nanovllm.lessons.catalog import get_lesson
from nanovllm.lessons.harness import implementation
from nanovllm.lessons.plug import (
    LessonRunError,
    PerSequenceAttention,
    count_your_attention,
    host_tier_of,
    your_attention,
    your_host_tier,
    your_step_inputs,
)
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
            ScheduledRequest(request, new, computed, (table,), samples=True, is_prefill=new > 1)
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


def _engine(parts, num_layers: int = 2):
    """What a lesson reads of a built engine: its config (with its parts) and model args."""
    return SimpleNamespace(
        config=SimpleNamespace(parts=parts),
        model_args=SimpleNamespace(num_hidden_layers=num_layers),
    )


def test_attention_is_counted_in_the_part_that_built_it():
    """Every layer's attention must be the part's; an engine built without the part, or with
    a layer it did not build, is named."""
    part = your_attention(lambda *args: PerSequenceAttention(None, None, None))
    engine = _engine(EngineParts(attention_cls=part))
    for _ in range(2):
        part(4, 2, 8, 0.5)
    assert count_your_attention(engine) == 2
    with pytest.raises(LessonRunError, match="only 2 of the engine's 3 layers"):
        count_your_attention(_engine(EngineParts(attention_cls=part), num_layers=3))
    with pytest.raises(LessonRunError, match="without the lesson's part `attention_cls`"):
        count_your_attention(_engine(None))


def test_the_host_tier_is_the_one_the_connector_fills():
    """The connector's two sides each build a tier; the scheduler's side is the one that
    takes entries, whichever was built first."""
    part = your_host_tier(HostBlockTier)
    engine = _engine(EngineParts(host_tier_cls=part))
    worker, scheduler = part(4), part(4)
    assert host_tier_of(engine) is worker  # none filled yet: either serves
    scheduler.insert(b"h" * 32)
    assert host_tier_of(engine) is scheduler
