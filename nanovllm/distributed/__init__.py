"""Tensor parallelism's plumbing: the process group, its messages, and the ranks' processes.

- `parallel_state`: this process's rank and the group's size (`get_tp_rank`,
  `get_tp_world_size`), set up explicitly or from torchrun's environment.
- `communication`: all-reduce, all-gather, and broadcasting a step's inputs from rank 0, each a
  no-op for a group of one.
- `worker_group`: rank 0 in the driver process and ranks 1..N-1 in spawned workers, called
  together each step, with dead ranks reported and no process left behind.
- `validation`: a tensor-parallel size that cannot work is refused before anything starts.
- `expert_parallel`: a mixture of experts with its experts split over the ranks (each rank
  computes the pairs routed to its experts; one all-reduce combines them).

The sharded layers themselves live with the model: `nanovllm.models.linear` and
`nanovllm.models.embedding`.
"""

from nanovllm.distributed.communication import (
    broadcast_object,
    broadcast_tensor_dict,
    gather_object,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from nanovllm.distributed.parallel_state import (
    as_tp_rank,
    destroy_distributed,
    get_tp_rank,
    get_tp_world_size,
    init_distributed,
    init_distributed_from_env,
)
from nanovllm.distributed.validation import check_device_count, check_tensor_parallel_size
from nanovllm.distributed.worker_group import WorkerDiedError, WorkerGroup, WorkerGroupError

__all__ = [
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "as_tp_rank",
    "broadcast_object",
    "broadcast_tensor_dict",
    "check_device_count",
    "check_tensor_parallel_size",
    "destroy_distributed",
    "gather_object",
    "get_tp_rank",
    "get_tp_world_size",
    "init_distributed",
    "init_distributed_from_env",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
