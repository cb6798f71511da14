"""InputStaging (executor/staging.py): a step's tensors packed into one buffer and sent as one copy.

Without a GPU the staging runs with device="cpu" (no pinning, no events): what is checked here is
the packing, against the tensors themselves as the oracle. Each tensor comes back with its
dtype, shape and values, whatever mix of dtypes and sizes (empty ones too) a step sends; and
what one call handed out is unchanged by later calls that rewrite the reused buffer. The pinned
copy itself is checked on a GPU (tests/gpu/test_gpu_engine.py).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.executor.staging import ALIGN, InputStaging

DTYPES = (torch.int64, torch.int32, torch.float32)


@st.composite
def steps(draw) -> list[torch.Tensor]:
    """One step's tensors: 1 to 9 of them, 1-D or 2-D, empty ones included."""
    tensors = []
    for _ in range(draw(st.integers(1, 9))):
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(st.sampled_from([(draw(st.integers(0, 40)),), (draw(st.integers(0, 5)), 3)]))
        seed = draw(st.integers(0, 2**31 - 1))
        values = torch.randint(
            -(2**30), 2**30, shape, generator=torch.Generator().manual_seed(seed)
        )
        tensors.append(values.to(dtype))
    return tensors


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(steps(), min_size=1, max_size=5))
def test_every_tensor_comes_back_whole_and_earlier_calls_stay_valid(calls) -> None:
    staging = InputStaging(torch.device("cpu"))
    handed_out = []
    for tensors in calls:
        copies = staging.to_device(tensors)
        handed_out.append((tensors, copies))
        needed = sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for t in tensors)
        assert staging.buffer.numel() >= needed
    for tensors, copies in handed_out:  # after every later call has rewritten the buffer
        assert len(copies) == len(tensors)
        for original, copy in zip(tensors, copies):
            assert copy.dtype == original.dtype and copy.shape == original.shape
            assert torch.equal(copy, original)
            if original.numel():  # a copy, not the caller's memory
                assert copy.data_ptr() != original.data_ptr()


def test_the_buffer_is_reused_until_a_step_needs_more() -> None:
    staging = InputStaging(torch.device("cpu"))
    staging.to_device([torch.arange(100)])
    first = staging.buffer
    staging.to_device([torch.arange(50), torch.arange(7, dtype=torch.int32)])
    assert staging.buffer is first  # fits: the same buffer, rewritten
    staging.to_device([torch.arange(300)])
    assert staging.buffer is not first and staging.buffer.numel() >= 300 * 8
