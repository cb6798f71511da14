"""The few messages tensor-parallel ranks exchange, each a no-op for a group of 1.

A tensor-parallel forward pass needs only two collectives:
- all-reduce (sum): after a row-parallel linear layer, each rank holds a partial sum of the
  output; adding them gives every rank the whole output. Also after the vocab-parallel
  embedding, where each rank looked up only the token ids in its slice of the vocabulary.
- all-gather: the vocab-parallel LM head leaves each rank with the logits of its slice of the
  vocabulary; gathering concatenates them into the full logits.

And one for driving the ranks: rank 0 runs the scheduler, so each step's inputs (token ids,
positions, block tables...) are broadcast from rank 0 to the others, once per step.

At world size 1 every helper returns its input untouched without calling torch.distributed, so
the same layers run on one device with no process group and no cost.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nanovllm.distributed.parallel_state import get_cpu_group, get_parallel_state, get_tp_rank

# [num_tokens, ...] tensors of one step, or plain Python values (ints, lists, dataclasses)
StepInputs = dict[str, Any]


def _group_size() -> int:
    state = get_parallel_state()
    return 1 if state is None else state.world_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over all ranks, in place; every rank gets the sum."""
    if _group_size() == 1:
        return x
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, in rank order; every rank gets the result.

    [..., n, ...] on each of N ranks -> [..., N * n, ...] (n at position `dim`).
    """
    world_size = _group_size()
    if world_size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=dim)


def broadcast_object(obj: Any = None, src: int = 0) -> Any:
    """Send a picklable Python object from rank `src` to all ranks; returns it on every rank.

    Other ranks pass nothing (their argument is ignored). Costs two broadcasts (the pickle's
    length, then its bytes) over the CPU group.
    """
    if _group_size() == 1:
        return obj
    box = [obj if get_tp_rank() == src else None]
    dist.broadcast_object_list(box, src=src, group=get_cpu_group())
    return box[0]


def broadcast_tensor_dict(inputs: StepInputs | None = None, src: int = 0) -> StepInputs:
    """Send one step's inputs from rank `src` to all ranks; returns them on every rank.

    CPU tensors and plain values travel inside one pickled object (one round of messages,
    whatever the number of tensors). GPU tensors stay off the pickle: their shapes and dtypes go
    with the object, then each tensor is broadcast on the device group (NCCL), arriving on every
    rank's own device.
    """
    if _group_size() == 1:
        return inputs if inputs is not None else {}
    is_src = get_tp_rank() == src
    if is_src:
        if inputs is None:
            raise ValueError(f"rank {src} is the source of the broadcast and must pass the inputs")
        meta = {
            key: _TensorSpec(tuple(v.shape), v.dtype)
            if isinstance(v, torch.Tensor) and v.device.type != "cpu"
            else v
            for key, v in inputs.items()
        }
    meta = broadcast_object(meta if is_src else None, src=src)
    device = get_parallel_state().device
    out: StepInputs = {}
    for key, value in meta.items():
        if isinstance(value, _TensorSpec):
            tensor = inputs[key].contiguous() if is_src else value.empty(device)
            dist.broadcast(tensor, src=src)
            value = tensor
        out[key] = value
    return out


class _TensorSpec:
    """A device tensor's shape and dtype, sent ahead so receivers can allocate it."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=device)


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Collect one picklable object from every rank on rank `dst` (a list in rank order).

    Other ranks get None. Used to bring back per-rank results, such as each rank's forward time.
    """
    world_size = _group_size()
    if world_size == 1:
        return [obj]
    is_dst = get_tp_rank() == dst
    out: list[Any] | None = [None] * world_size if is_dst else None
    dist.gather_object(obj, out, dst=dst, group=get_cpu_group())
    return out
