"""`nanovllm microbench`: the block manager's cost per operation, from 10^3 to 10^6 blocks.

The free block queue exists so that taking, returning and cache-hitting a block costs O(1)
whatever the size of the cache. This command measures it: for each cache size it times many
allocate (one block), free (one block) and prefix-cache-hit operations and prints the cost of
each in microseconds, plus the ratio of the largest cache's cost to the smallest's. Flat costs
(ratio near 1) are the point; a list-based queue would grow 1000x across the table.
"""

from __future__ import annotations

import argparse
import gc
import time

from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), arrival_index=0)


def measure(num_blocks: int, num_ops: int) -> dict[str, float]:
    """Microseconds per allocate, free and cache hit with a cache of `num_blocks` blocks."""
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=True)
    # Fill half the cache with cached-but-free one-block prefixes, so hits come from all over
    # the middle of the free queue.
    half = num_blocks // 2
    fillers = [_request(f"f{i}", [i] * BLOCK_SIZE) for i in range(half)]
    for req in fillers:
        kv.allocate_slots(req, BLOCK_SIZE)
    for req in fillers:
        kv.free(req)

    # Each op's request is one block of fresh tokens: one popleft (an eviction) per allocate.
    requests = [_request(f"r{i}", [num_blocks + i] * BLOCK_SIZE) for i in range(num_ops)]
    # Freeze the set-up objects out of Python's cyclic GC: its full collections rescan every live
    # object, a cost that grows with the cache whatever the algorithm does.
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    for req in requests:
        kv.allocate_slots(req, BLOCK_SIZE)
    allocate = time.perf_counter() - start

    start = time.perf_counter()
    for req in requests:
        kv.free(req)
    free = time.perf_counter() - start

    # Hits on cached free blocks spread over the queue (hashing included, as in the engine).
    stride = max(half // num_ops, 1)
    hits = [_request(f"h{i}", [(i * stride) % half] * BLOCK_SIZE + [0]) for i in range(num_ops)]
    start = time.perf_counter()
    for req in hits:
        computed, _ = kv.get_computed_blocks(req)
        kv.allocate_slots(req, 1, computed)
        kv.free(req)
    hit = time.perf_counter() - start
    gc.unfreeze()
    us = 1e6 / num_ops
    return {"allocate_us": allocate * us, "free_us": free * us, "hit_alloc_free_us": hit * us}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", type=int, default=20000, help="operations per measurement")
    parser.add_argument("--max-exp", type=int, default=6, help="largest cache: 10^N blocks")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"KVCacheManager cost per operation (block_size={BLOCK_SIZE})")
    for col in ("blocks", "allocate (us)", "free (us)", "cache hit + alloc + free (us)"):
        table.add_column(col, justify="right")
    rows = []
    for exp in range(3, args.max_exp + 1):
        n = 10**exp
        r = measure(n, min(args.ops, n // 2))
        rows.append(r)
        table.add_row(
            f"10^{exp}",
            f"{r['allocate_us']:.2f}",
            f"{r['free_us']:.2f}",
            f"{r['hit_alloc_free_us']:.2f}",
        )
    console = Console()
    console.print(table)
    first, last = rows[0], rows[-1]
    console.print(
        "ratio 10^{} / 10^3: allocate {:.2f}x, free {:.2f}x, hit {:.2f}x".format(
            args.max_exp,
            last["allocate_us"] / first["allocate_us"],
            last["free_us"] / first["free_us"],
            last["hit_alloc_free_us"] / first["hit_alloc_free_us"],
        )
    )
    return 0
