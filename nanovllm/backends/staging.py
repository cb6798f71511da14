"""A step's small input tensors sent to the GPU in one copy, through one pinned buffer.

Why. A step's inputs are eight small tensors built on the host: the token ids, positions, slot
mapping, block tables, context lengths, query starts and the decodes' indices. Sent one by one,
each is a transfer of its own: a `pin_memory()` (an allocation and a copy on the host), then a
copy to the device, which is queued and run as an operation of its own however few its bytes.
`InputStaging` writes them all into one page-locked ("pinned") host buffer that lives from
step to step, sends that with one copy, and hands out views of the copy on the device. (What
it saves per step is for `.ci/gpu` to measure, nanovllm/bench/README.md.)

Pinned memory is what lets the copy run while the host goes on (`non_blocking=True`): the
GPU's copy engine reads page-locked memory directly, while from ordinary pageable memory CUDA
must first copy the bytes into a pinned buffer of its own, with the host waiting.

Reusing the pinned buffer has one rule: the host must not overwrite it while the previous
step's copy may still be reading it. So an event is recorded after each copy and waited for
before the next write. (Between two steps the wait should cost nothing: the earlier step's
sampling, reading its tokens back, has waited for everything queued before them, that copy
too.) The device side is a new tensor each step, from torch's caching allocator: the views a
step hands out stay valid as long as someone holds them, whatever later steps send.

Layout: the tensors in the order given, each starting at a multiple of 8 bytes (so that every
dtype's view of the bytes is aligned); each one comes back as
`device_bytes[offset : offset + nbytes].view(dtype).view(shape)`.

On a CPU there is nothing to send (the runner does not use this there); the class still works
with device="cpu" (no pinning, no events), which is how its packing is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ALIGN = 8  # bytes: the largest element size sent (int64)


class InputStaging:
    """One pinned host buffer, reused every step, and one copy of it to `device` per call."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self.buffer = torch.empty(0, dtype=torch.uint8)  # host bytes; grows, never shrinks
        # Recorded after each copy from the buffer (an event never recorded counts as passed).
        self.copied = torch.cuda.Event() if self.pinned else None

    def to_device(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of `tensors` (host tensors, any shapes and dtypes) on the device: one
        transfer for all of them, not blocking the host on a GPU."""
        sizes = [t.numel() * t.element_size() for t in tensors]  # bytes
        offsets, end = [], 0
        for size in sizes:
            offsets.append(end)
            end += -(-size // ALIGN) * ALIGN
        if self.copied is not None:
            self.copied.synchronize()  # the last copy has read the buffer: free to overwrite
        if end > self.buffer.numel():
            capacity = max(end, 2 * self.buffer.numel())
            self.buffer = torch.empty(capacity, dtype=torch.uint8, pin_memory=self.pinned)
        for t, offset, size in zip(tensors, offsets, sizes):
            self.buffer[offset : offset + size].view(t.dtype).copy_(t.reshape(-1))
        on_device = torch.empty(end, dtype=torch.uint8, device=self.device)
        on_device.copy_(self.buffer[:end], non_blocking=self.pinned)
        if self.copied is not None:
            self.copied.record()
        return [
            on_device[offset : offset + size].view(t.dtype).view(t.shape)
            for t, offset, size in zip(tensors, offsets, sizes)
        ]
