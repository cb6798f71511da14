"""Checks on a tensor-parallel size, made before any process starts.

Tensor parallelism cuts every layer into `tensor_parallel_size` equal slices, so the numbers it
cuts must divide evenly: the attention heads (each rank runs whole heads), the key/value heads
(each rank holds an equal share, or when there are fewer KV heads than ranks, each KV head is
copied to an equal number of ranks) and the MLP's intermediate size. The vocabulary needs no
check: it is padded to a multiple of the size (see `nanovllm.models.embedding`).

On CUDA each rank owns one GPU, so there cannot be more ranks on a machine than devices.

Failing here, with both numbers named, is far kinder than a shape error from inside a worker
process minutes later.
"""

from __future__ import annotations

import torch


def check_tensor_parallel_size(
    tensor_parallel_size: int,
    num_attention_heads: int,
    num_key_value_heads: int | None = None,
    intermediate_size: int | None = None,
) -> None:
    """Raise ValueError, naming the numbers, when the model cannot be cut into this many slices."""
    tp = tensor_parallel_size
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    if num_attention_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} does not divide num_attention_heads="
            f"{num_attention_heads}: each rank must hold the same number of whole heads"
        )
    kv = num_key_value_heads
    if kv is not None and kv % tp and tp % kv:
        raise ValueError(
            f"tensor_parallel_size={tp} and num_key_value_heads={kv}: one must divide the "
            f"other (KV heads are split evenly, or each copied to tensor_parallel_size/{kv} ranks)"
        )
    if intermediate_size is not None and intermediate_size % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} does not divide intermediate_size={intermediate_size}"
        )


def check_device_count(
    ranks_on_this_machine: int, device_type: str, device_count: int | None = None
) -> None:
    """Raise ValueError when a machine is asked for more CUDA ranks than it has GPUs.

    CPU ranks share the machine's cores and need no check. `device_count` defaults to what torch
    sees here (`torch.cuda.device_count()`).
    """
    if device_type != "cuda":
        return
    if device_count is None:
        device_count = torch.cuda.device_count()
    if ranks_on_this_machine > device_count:
        raise ValueError(
            f"tensor_parallel_size={ranks_on_this_machine} ranks on this machine, but it has "
            f"only {device_count} CUDA devices: each rank needs its own"
        )
