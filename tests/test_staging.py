"""InputStaging (backends/staging.py): a step's tensors packed into one buffer and sent as one copy.

Without a GPU the staging runs with device="cpu" (no pinning, no events): what is checked here is
the packing, against the tensors themselves as the oracle. Each tensor comes back with its
dtype, shape and values, whatever mix of dtypes and sizes (empty ones too) a step sends; and
what one call handed out is unchanged by later calls that rewrite the reused buffer. The pinned
copy itself is checked on a GPU (tests/gpu/test_gpu_engine.py).
"""

from __future__ import annotations

import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.backends.staging import ALIGN, InputStaging

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


@settings(max_examples=examples(60), deadline=None)
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


def test_the_runner_sends_each_host_tensor_of_a_step_once() -> None:
    """`CudaModelRunner.inputs_on_device`, with the "meta" device standing in for a GPU (tensors
    with shapes and dtypes but no values): every tensor of the step, the logits rows included,
    arrives there in one staging call, the metadata's lists stay as they are, and tensors that
    are there already are not sent again. On a CPU nothing moves at all."""
    from decode_steps import decode_step

    from nanovllm.backends.cuda_runner import CudaModelRunner
    from nanovllm.executor.model_runner import ModelRunner

    input_ids, positions, meta = decode_step([5, 40, 17], 0, 16, 32)
    cpu_runner = ModelRunner(None, 16, torch.float32, torch.device("cpu"))
    same = cpu_runner.inputs_on_device(input_ids, positions, meta, [0, 2])
    assert same[0] is input_ids and same[1] is positions and same[2] is meta

    runner = CudaModelRunner(None, 16, torch.float32, torch.device("meta"))
    calls = []
    to_device = runner.staging.to_device
    runner.staging.to_device = lambda tensors: calls.append(len(tensors)) or to_device(tensors)
    ids, pos, moved, rows = runner.inputs_on_device(input_ids, positions, meta, [0, 2])
    pairs = [(input_ids, ids), (positions, pos)]
    pairs += [(meta.tensors()[name], t) for name, t in moved.tensors().items()]
    assert calls == [2 + len(meta.tensors()) + 1]  # one call: inputs, metadata, logits rows
    assert moved.tensors().keys() == meta.tensors().keys()
    for original, there in pairs:
        assert there.device.type == "meta"
        assert there.shape == original.shape and there.dtype == original.dtype
    assert rows.device.type == "meta" and rows.shape == (2,)
    assert moved.seq_lens_list == meta.seq_lens_list
    assert moved.prefill_seq_indices == meta.prefill_seq_indices

    again = runner.inputs_on_device(ids, pos, moved, rows)
    assert calls == [calls[0]]  # already on the device: nothing sent
    assert again[0] is ids and again[3] is rows and again[2] is moved

    no_rows = runner.inputs_on_device(input_ids, positions, meta, [])  # the draft's pass
    assert calls[1:] == [2 + len(meta.tensors())] and no_rows[3] == []
