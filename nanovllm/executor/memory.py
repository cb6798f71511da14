"""How much memory the KV cache gets.

Everything the engine does not need for the model itself should hold KV blocks: more blocks mean
more requests in flight and fewer preemptions. So on a GPU the budget is *measured*, as vLLM
does it:

    budget = total GPU memory x gpu_memory_utilization
             - memory already in use (the weights, the CUDA context, other processes)
             - the activation peak of the largest step (a forward pass of
               max_num_batched_tokens tokens, measured by running one)
             - with CUDA graphs, their memory pool (measured the same way: the peak of a
               forward pass over max_num_seqs one-token sequences, the largest graph's batch)

The graphs are captured after the KV cache is allocated (a graph holds the cache's addresses),
and their pool is memory of its own: the intermediates of a captured forward pass stay with the
graph, and eager steps cannot use them. So it must be set aside before the cache takes the rest.

The measuring is the GPU runner's (`nanovllm/backends/cuda_runner.py`, `peak_memory_of_step`);
this file holds the arithmetic. On a CPU there is nothing to profile against (the KV cache is
ordinary RAM, shared with everything else), so the budget is a share of the memory the system
says is available when the engine starts, with a ceiling:

    budget = min(available RAM x CPU_KV_CACHE_FRACTION, CPU_KV_CACHE_CAP)

A quarter leaves the rest to the weights, the activations and the other processes on the
machine; the 4 GiB ceiling is the size vLLM's CPU build long took by default, and keeps a large
machine from zeroing tens of GiB that a small model never fills. `kv_cache_memory_bytes`
overrides it, as in vLLM (whose CPU build also reads `VLLM_CPU_KVCACHE_SPACE`, in GiB).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nanovllm.config import EngineConfig

CPU_KV_CACHE_FRACTION = 0.25
CPU_KV_CACHE_CAP = 4 * 2**30


def cpu_kv_cache_budget(available: int, kv_cache_memory_bytes: int | None = None) -> int:
    """The KV budget on a CPU: `kv_cache_memory_bytes` when given, else CPU_KV_CACHE_FRACTION of
    the `available` bytes, at most CPU_KV_CACHE_CAP. A ValueError names a bad value."""
    if kv_cache_memory_bytes is not None:
        if not _is_count(kv_cache_memory_bytes) or kv_cache_memory_bytes < 1:
            raise ValueError(
                f"kv_cache_memory_bytes must be an int >= 1, got {kv_cache_memory_bytes!r}"
            )
        return kv_cache_memory_bytes
    if not _is_count(available) or available < 0:
        raise ValueError(f"available memory must be an int >= 0 bytes, got {available!r}")
    return min(int(available * CPU_KV_CACHE_FRACTION), CPU_KV_CACHE_CAP)


def available_cpu_memory() -> int:
    """Bytes of RAM the system can give without swapping: Linux's MemAvailable (free memory plus
    the page cache it can drop), else the machine's physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # (kB)
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def budget_from_profile(
    total: int, utilization: float, in_use: int, activation_peak: int, graph_pool: int = 0
) -> int:
    """The bytes left for the KV cache (see the module docstring); negative if none are."""
    return int(total * utilization) - in_use - activation_peak - graph_pool


def gpu_kv_cache_budget(
    total: int, in_use: int, activation_peak: int, graph_pool: int, config: EngineConfig
) -> int:
    """`budget_from_profile`, or a ValueError naming every term when it leaves nothing."""
    budget = budget_from_profile(
        total, config.gpu_memory_utilization, in_use, activation_peak, graph_pool
    )
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization={config.gpu_memory_utilization} leaves no memory for the KV "
            f"cache: {total / 2**30:.1f} GiB x {config.gpu_memory_utilization} minus "
            f"{in_use / 2**30:.1f} GiB in use, a {activation_peak / 2**30:.2f} GiB activation "
            f"peak (max_num_batched_tokens={config.max_num_batched_tokens}) and "
            f"{graph_pool / 2**30:.2f} GiB for CUDA graphs"
        )
    return budget


def kv_bytes_per_block(
    model_args,
    block_size: int,
    dtype: torch.dtype,
    tensor_parallel_size: int = 1,
    num_kv_tensors: int | None = None,
) -> int:
    """Bytes of one KV block on one rank (which holds num_kv_heads / tp heads, at least 1), in
    each of `num_kv_tensors` K/V tensor pairs (default: one per layer; with KV cache groups,
    one per layer of a group, `core/kv_cache_interface.py`)."""
    kv_heads = max(model_args.num_key_value_heads // tensor_parallel_size, 1)
    num_kv_tensors = num_kv_tensors or model_args.num_hidden_layers
    per_token = 2 * num_kv_tensors * kv_heads * model_args.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()
