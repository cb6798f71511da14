"""Who am I in the tensor-parallel group? The process group and this process's place in it.

Tensor parallelism runs one model across N processes ("ranks"), each holding a slice of every
layer. The ranks talk through `torch.distributed`: gloo on a CPU, NCCL on CUDA GPUs. This module
owns that process group and answers the two questions every parallel layer asks when it is
built: `get_tp_rank()` (which slice is mine?) and `get_tp_world_size()` (into how many slices is
each layer cut?).

Nothing here needs a process group at world size 1: before `init_distributed` is called (or
after `destroy_distributed`), this process is rank 0 of a group of 1, every layer holds the
whole weight, and the communication helpers return their input.

All ranks form one tensor-parallel group (there is no pipeline or data parallelism), so the
tensor-parallel group is torch's default ("world") group. On NCCL a second, gloo group over the
same ranks (`get_cpu_group()`) carries Python objects such as a step's scheduling decisions,
which need not travel through GPU memory; on gloo the two groups are the same.

Two ways in:
- `init_distributed(rank, world_size, master_addr, master_port)`: explicit, used by the worker
  group that spawns ranks on one machine (`nanovllm.distributed.worker_group`).
- `init_distributed_from_env()`: under `torchrun`, which sets RANK, WORLD_SIZE, LOCAL_RANK,
  MASTER_ADDR and MASTER_PORT in every process it starts, on one machine or many.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nanovllm.distributed.rendezvous import gloo_bound_to, listening_store

DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ParallelState:
    """This process's place in the tensor-parallel group."""

    rank: int
    world_size: int
    local_rank: int  # the rank among the processes on this machine: picks the CUDA device
    backend: str  # "gloo" or "nccl"
    device: torch.device  # where this rank's tensors live
    cpu_group: dist.ProcessGroup | None  # gloo group for Python objects (None at world size 1)


_STATE: ParallelState | None = None


def default_backend(device_type: str) -> str:
    """NCCL between GPUs, gloo between CPUs."""
    return "nccl" if device_type == "cuda" else "gloo"


def _start_group_names_at_zero() -> None:
    """torch names each process group by how many this process has made before it (its "group
    count"), and the ranks find each other in the store under that name. Destroying the default
    group sets the count back to 0, but an `init_process_group` that fails (a rank that never
    came) has counted one all the same. A fresh worker process starts at 0, so a driver that had
    once failed would wait for its workers under another name until its timeout, and so would
    every group it started after. With no group alive, start at 0 as a fresh process does."""
    if not dist.is_initialized():
        dist.distributed_c10d._world.group_count = 0


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    *,
    local_rank: int | None = None,
    device_type: str = "cpu",
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    store: dist.Store | None = None,
    init_method: str | None = None,
) -> ParallelState:
    """Join the group as `rank` of `world_size`; rank 0 hosts the rendezvous at master_addr:port.

    Blocks until all `world_size` ranks have joined (or `timeout_s` passes). `timeout_s` also
    bounds every later collective: a rank that stops answering makes the others' next collective
    raise instead of waiting forever. `store` lets a caller that already created the rendezvous
    store (to learn a free port before starting the other ranks) hand it over; `init_method`
    ("env://") lets torch find the rendezvous itself, as it must under torchrun, whose agent
    already hosts the store at MASTER_PORT. Gloo's connections listen on master_addr's
    interface (`rendezvous.py`).
    """
    global _STATE
    if _STATE is not None:
        raise RuntimeError(
            f"the tensor-parallel group is already initialised (rank {_STATE.rank} of "
            f"{_STATE.world_size}); call destroy_distributed() first"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of size {world_size}")
    local_rank = rank if local_rank is None else local_rank
    backend = backend or default_backend(device_type)
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device(device_type)
    cpu_group = None
    if world_size > 1:
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None and init_method is None:
            store = (
                listening_store(master_addr, master_port, timeout)[0]
                if rank == 0
                else dist.TCPStore(master_addr, master_port, world_size, timeout=timeout)
            )
        _start_group_names_at_zero()
        # (under torchrun, gloo listens where GLOO_SOCKET_IFNAME says, as torch's docs tell)
        binding = gloo_bound_to(master_addr) if init_method is None else nullcontext()
        try:
            with binding:
                dist.init_process_group(
                    backend,
                    init_method=init_method,
                    store=store,
                    rank=rank,
                    world_size=world_size,
                    timeout=timeout,
                )
                cpu_group = (
                    dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
                )
        except BaseException:
            if dist.is_initialized():  # half made (its cpu group failed): the next init can run
                dist.destroy_process_group()
            raise
    _STATE = ParallelState(rank, world_size, local_rank, backend, device, cpu_group)
    return _STATE


def init_distributed_from_env(
    *, device_type: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S
) -> ParallelState:
    """Join the group described by torchrun's environment variables.

    torchrun (`torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT script.py`)
    starts every process with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set.
    Without them (a plain `python script.py`) this is rank 0 of a group of 1.
    """
    env = os.environ
    return init_distributed(
        int(env.get("RANK", "0")),
        int(env.get("WORLD_SIZE", "1")),
        local_rank=int(env.get("LOCAL_RANK", env.get("RANK", "0"))),
        device_type=device_type,
        timeout_s=timeout_s,
        init_method="env://",  # reads MASTER_ADDR and MASTER_PORT
    )


def destroy_distributed() -> None:
    """Leave the group (if any) and go back to being rank 0 of 1."""
    global _STATE
    if _STATE is not None and _STATE.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
    _STATE = None


def get_parallel_state() -> ParallelState | None:
    """The group this process belongs to, or None when it runs alone."""
    return _STATE


def get_tp_rank() -> int:
    """This process's index in the tensor-parallel group (0 when running alone)."""
    return _STATE.rank if _STATE is not None else 0


def get_tp_world_size() -> int:
    """How many ranks share each layer (1 when running alone)."""
    return _STATE.world_size if _STATE is not None else 1


def get_cpu_group() -> dist.ProcessGroup | None:
    """The gloo group that carries Python objects between ranks (None when running alone)."""
    return _STATE.cpu_group if _STATE is not None else None


@contextmanager
def as_tp_rank(rank: int, world_size: int) -> Iterator[None]:
    """Inside this block, this process builds layers as `rank` of `world_size` would.

    No process group is involved: layers take rank `rank`'s shapes and weight loaders load its
    slices, which is enough to look at a shard, plan a rank's memory, or load one rank's weights
    in a test. Communication is not available (a collective would fail), except at
    world_size 1, where `as_tp_rank(0, 1)` means "alone" even inside a real group.
    """
    global _STATE
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of size {world_size}")
    saved = _STATE
    _STATE = (
        None
        if world_size == 1
        else ParallelState(rank, world_size, rank, "none", torch.device("cpu"), None)
    )
    try:
        yield
    finally:
        _STATE = saved
