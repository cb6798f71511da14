"""Measuring, on a GPU, how much memory a runner can give its KV cache (the terms of the budget:
`nanovllm/executor/memory.py`).

Functions of any runner, the plain `ModelRunner` as much as the CUDA one: each runs the
runner's own `prepare_inputs` and `forward_logits` over the largest step the scheduler can make
(`profile_step`), in a temporary KV cache, and reads the device's memory counters around it.
"""

from __future__ import annotations

import torch

from nanovllm.core.scheduler import ScheduledRequest, SchedulerOutput
from nanovllm.executor.memory import gpu_kv_cache_budget
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams


def measure_kv_budget(runner: ModelRunner, config, max_model_len: int, graphs: bool = False) -> int:
    """Bytes `runner`'s rank can give its KV cache (`executor/memory.py`); `graphs`: less the
    memory pool of the CUDA graphs that will be captured."""
    device = runner.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    peak = peak_memory_of_step(runner, config.max_num_batched_tokens, config.max_num_seqs)
    pool = peak_memory_of_step(runner, config.max_num_seqs, config.max_num_seqs) if graphs else 0
    return gpu_kv_cache_budget(total, total - free, peak, pool, config)


def peak_memory_of_step(runner: ModelRunner, num_tokens: int, num_seqs: int) -> int:
    """Bytes a forward pass over `num_tokens` tokens of `num_seqs` sequences takes from the
    device at its peak (`profile_step`), besides its temporary KV cache.

    Counted as memory *reserved*, not allocated: torch's caching allocator takes memory
    from the device in segments that it does not give back between steps, and a CUDA
    graph's private pool is made of such segments too. The pass starts from an emptied
    cache, with no free segments to reuse, as a new pool does.
    """
    device = runner.device
    runner.kv_caches = []
    torch.cuda.empty_cache()
    inputs = runner.prepare_inputs(profile_step(runner, num_tokens, num_seqs))
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


def profile_step(runner: ModelRunner, num_tokens: int, num_seqs: int) -> SchedulerOutput:
    """The largest step the scheduler can make, for measuring its memory.

    `num_tokens` prompt tokens split over `num_seqs` fresh requests, every one sampling (so
    the LM head sees its largest batch too), in a temporary KV cache just big enough for
    them, allocated here in place of the runner's.
    """
    num_seqs = max(min(num_seqs, num_tokens), 1)
    lengths = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
    blocks_per_seq = [-(-n // runner.block_size) for n in lengths]
    runner.allocate_kv_cache(sum(blocks_per_seq))
    out = SchedulerOutput(step=0)
    first_block = 0
    for i, (n, num_blocks) in enumerate(zip(lengths, blocks_per_seq)):
        request = Request(f"profile-{i}", [0] * n, SamplingParams(temperature=0), 0)
        block_table = tuple(range(first_block, first_block + num_blocks))
        first_block += num_blocks
        out.scheduled.append(ScheduledRequest(request, n, 0, (block_table,), True, True))
    return out
