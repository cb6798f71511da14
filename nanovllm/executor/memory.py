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

On a CPU there is nothing to profile against (the KV cache is ordinary RAM, shared with
everything else), so the budget is a fixed `CPU_KV_CACHE_BYTES` unless `kv_cache_memory_bytes`
says otherwise (vLLM's CPU build likewise takes it from `VLLM_CPU_KVCACHE_SPACE`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nanovllm.config import EngineConfig
    from nanovllm.executor.model_runner import ModelRunner

CPU_KV_CACHE_BYTES = 512 * 2**20


def budget_from_profile(
    total: int, utilization: float, in_use: int, activation_peak: int, graph_pool: int = 0
) -> int:
    """The bytes left for the KV cache (see the module docstring); negative if none are."""
    return int(total * utilization) - in_use - activation_peak - graph_pool


def kv_cache_budget(
    runner: ModelRunner, config: EngineConfig, max_model_len: int, graphs: bool = False
) -> int:
    """Bytes for the KV cache on the runner's device (the model must already be loaded);
    `graphs`: decode steps will be captured as CUDA graphs, whose pool is set aside too."""
    if runner.device.type != "cuda":
        return CPU_KV_CACHE_BYTES
    device = runner.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    in_use = total - free
    activation_peak = _peak_of_step(runner, config.max_num_batched_tokens, config.max_num_seqs)
    graph_pool = _peak_of_step(runner, config.max_num_seqs, config.max_num_seqs) if graphs else 0
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


def _peak_of_step(runner: ModelRunner, num_tokens: int, num_seqs: int) -> int:
    """Bytes a forward pass over `num_tokens` tokens of `num_seqs` sequences takes from the
    device at its peak (`ModelRunner.profile_step`), besides its temporary KV cache.

    Counted as memory *reserved*, not allocated: torch's caching allocator takes memory from the
    device in segments (2 MiB for small tensors, 20 MiB for those of 1-10 MiB, ...) that it does
    not give back between steps, and a CUDA graph's private pool is made of such segments too.
    The pass starts from an emptied cache, with no free segments to reuse, as a new pool does.
    """
    device = runner.device
    runner.kv_caches = []
    torch.cuda.empty_cache()
    inputs = runner.prepare_inputs(runner.profile_step(num_tokens, num_seqs))
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_reserved(device)
    # This rank's forward alone: with tensor parallelism every rank profiles at once.
    runner.forward_logits(*inputs)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_reserved(device) - before
    runner.kv_caches = []
    torch.cuda.empty_cache()
    return peak
