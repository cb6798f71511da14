"""Lesson 05 demo: the engine's Triton kernels, run where you are.

On a GPU they are compiled; on a CPU they run in Triton's interpreter (tiny shapes only: it is
slow). Either way they must agree with the plain PyTorch references, which this demo checks.

Run it: `nanovllm lesson 5 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import time

import torch
from rich.console import Console
from rich.table import Table


def run(console: Console) -> None:
    torch.set_num_threads(1)
    from nanovllm.kernels.triton_setup import triton_available

    if not triton_available():
        console.print(
            "[yellow]Triton is not installed here (it ships for Linux x86_64 only), so this demo "
            "cannot run its kernels. The lesson's text still applies; the engine falls back to "
            "the torch attention of lesson 04.[/]"
        )
        return
    from nanovllm.kernels import triton_setup
    from nanovllm.kernels.paged_attention import paged_attention
    from nanovllm.kernels.paged_attention_naive import paged_attention_naive
    from nanovllm.kernels.reference import paged_attention_ref, store_kvcache_ref
    from nanovllm.kernels.store_kvcache import store_kvcache

    mode = "interpreted on the CPU" if triton_setup.is_interpreted() else "compiled for the GPU"
    device = "cpu" if triton_setup.is_interpreted() else "cuda"
    console.print(f"Triton kernels are [bold]{mode}[/] here.\n")

    # Two decoding sequences (lengths 21 and 6), 4 query heads sharing 2 KV heads, blocks of 4.
    g = torch.Generator().manual_seed(0)
    num_blocks, block_size, kv_heads, heads, head_dim = 12, 4, 2, 4, 16
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(device)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(device)
    block_tables = torch.tensor(
        [[7, 2, 9, 0, 5, 11], [3, 8, 0, 0, 0, 0]], dtype=torch.int32, device=device
    )
    seq_lens = torch.tensor([21, 6], dtype=torch.int32, device=device)
    query_start_loc = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    query = torch.randn(2, heads, head_dim, generator=g).to(device)
    scale = head_dim**-0.5

    # The write: the two new tokens' K/V into their slots (positions 20 and 5).
    k_new = torch.randn(2, kv_heads, head_dim, generator=g).to(device)
    v_new = torch.randn(2, kv_heads, head_dim, generator=g).to(device)
    slots = torch.tensor([11 * block_size + 0, 8 * block_size + 1], device=device)
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    store_kvcache_ref(k_new, v_new, ref_k, ref_v, slots)
    start = time.perf_counter()
    store_kvcache(k_new, v_new, key_cache, value_cache, slots)
    t_store = time.perf_counter() - start

    expected = paged_attention_ref(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale
    )
    results = Table(
        title="Decode attention for 2 sequences (21 and 6 tokens), GQA 4:2, block_size 4"
    )
    for col in ("kernel", "programs", "max error", "time"):
        results.add_column(col, justify="left" if col == "kernel" else "right")
    results.add_row(
        "store_kvcache",
        "2 = 2 tokens",
        f"{max((key_cache - ref_k).abs().max(), (value_cache - ref_v).abs().max()):.1e}",
        f"{t_store * 1e3:.0f} ms",
    )
    for name, fn, programs in [
        (
            "paged_attention_naive",
            lambda: paged_attention_naive(
                query, key_cache, value_cache, block_tables, seq_lens, scale
            ),
            "8 = 2 seqs x 4 heads",
        ),
        (
            "paged_attention",
            lambda: paged_attention(
                query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale
            ),
            "4 = 2 seqs x 2 KV heads",
        ),
    ]:
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
        results.add_row(
            name, programs, f"{(out - expected).abs().max():.1e}", f"{elapsed * 1e3:.0f} ms"
        )
    start = time.perf_counter()
    paged_attention_ref(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale
    )
    results.add_row(
        "paged_attention_ref (torch)", "-", "0", f"{(time.perf_counter() - start) * 1e3:.1f} ms"
    )
    console.print(results)
    console.print(
        "max error: against the plain PyTorch references. The naive kernel spills every score to "
        "memory and reads it back (two passes); paged_attention uses the online softmax."
    )
    if triton_setup.is_interpreted():
        console.print(
            "The interpreter runs each program in Python, one after the other: correct, and "
            "far slower than even the PyTorch loop. On a GPU the same kernels run all programs "
            "at once, and the second one reads each K/V tile once for a whole GQA group."
        )


if __name__ == "__main__":
    run(Console())
