"""Lesson 02 demo: the engine's KV cache manager handing out blocks, and what paging saves.

1. Three requests share a pool of 12 blocks of 4 slots. They grow, one finishes, another arrives:
   watch the block tables become scattered, and compute slots through them.
2. 64 requests of random lengths: slots wasted by reserving `max_model_len` per request, versus
   paging with 16-token blocks.

Run it: `nanovllm lesson 2 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import random

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.kv_cache_usage import num_allocated_slots
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

BLOCK_SIZE, NUM_BLOCKS = 4, 12
COLOURS = {"A": "cyan", "B": "magenta", "C": "yellow"}


def show_pool(
    console: Console, kv: KVCacheManager, requests: dict[str, Request], title: str
) -> None:
    """The pool, one column per physical block: its id, its owner, how many slots hold a token."""
    owner: dict[int, tuple[str, int]] = {}
    for name, request in requests.items():
        for i, block in enumerate(kv.get_block_table(request.request_id)):
            owner[block] = (name, min(BLOCK_SIZE, request.num_computed_tokens - i * BLOCK_SIZE))
    ids, owners, fills = Text("  block "), Text("  owner "), Text("  slots ")
    for block in range(NUM_BLOCKS):
        name, filled = owner.get(block, ("", 0))
        style = COLOURS.get(name, "dim")
        ids.append(f"{block:^6}")
        owners.append(f"{name or '-':^6}", style=style)
        fills.append(f" {'█' * filled}{'░' * (BLOCK_SIZE - filled)} ", style=style)
    console.print(f"\n[bold]{title}[/]")
    for line in (ids, owners, fills):
        console.print(line)
    for name, request in requests.items():
        table = kv.get_block_table(request.request_id)
        console.print(
            f"  block table {name} = {escape(str(table))}  ({request.num_computed_tokens} tokens)",
            style=COLOURS[name],
        )


def grow(kv: KVCacheManager, request: Request, n: int) -> None:
    """Give `request` room for `n` more tokens and count them computed (one engine step)."""
    request.all_token_ids.extend(range(n))  # the tokens themselves do not matter here
    assert kv.allocate_slots(request, n) is not None
    request.num_computed_tokens += n


def slots_of(table: list[int], start: int, end: int) -> list[int]:
    return [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, end)]


def run(console: Console) -> None:
    kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=False)
    live: dict[str, Request] = {}
    for i, name in enumerate("AB"):
        live[name] = Request(name, [], SamplingParams(), arrival_index=i)
    grow(kv, live["A"], 10)
    grow(kv, live["B"], 6)
    show_pool(console, kv, live, "1. A prefills 10 tokens, B prefills 6")

    for _ in range(3):
        grow(kv, live["A"], 1)  # three decode steps: A's third block fills, a fourth is taken
    show_pool(console, kv, live, "2. A decodes 3 tokens: it needs a 4th block")

    kv.free(live.pop("B"))
    live["C"] = Request("C", [], SamplingParams(), arrival_index=2)
    grow(kv, live["C"], 7)
    grow(kv, live["A"], 5)
    show_pool(
        console, kv, live, "3. B finishes (its blocks return to the free queue); C arrives; A grows"
    )
    console.print(
        "  C got blocks 6 and 7, not B's 3 and 4: freed blocks join the *back* of the free "
        "queue. Lesson 03 explains why."
    )

    table_a = kv.get_block_table("A")
    n = live["A"].num_computed_tokens
    console.print(
        f"\nA's last 6 tokens, positions {n - 6}..{n - 1}, are in slots "
        + escape(
            f"{slots_of(table_a, n - 6, n)}:\n  slot = block_table[p // {BLOCK_SIZE}] * "
            f"{BLOCK_SIZE} + p % {BLOCK_SIZE}: consecutive inside a block, jumping between blocks."
        )
    )

    # --- 2. What paging saves ---------------------------------------------------------------
    rng = random.Random(0)
    max_model_len, block_size = 2048, 16
    lengths = [rng.randint(50, 1200) for _ in range(64)]
    used = sum(lengths)
    reserved = len(lengths) * max_model_len
    pool = KVCacheManager(len(lengths) * max_model_len // block_size, block_size, False)
    for i, n in enumerate(lengths):
        request = Request(str(i), list(range(n)), SamplingParams(), arrival_index=i)
        pool.allocate_slots(request, n)
    paged = num_allocated_slots(pool)

    table = Table(
        title=f"\n64 requests of 50-1200 tokens (mean {used / 64:.0f}), max_model_len {max_model_len}"
    )
    for col in ("layout", "slots taken", "slots holding a token", "wasted"):
        table.add_column(col, justify="right" if col != "layout" else "left")
    table.add_row(
        "one contiguous region per request",
        f"{reserved:,}",
        f"{used:,}",
        f"{1 - used / reserved:.0%}",
    )
    table.add_row(
        f"paged, blocks of {block_size}", f"{paged:,}", f"{used:,}", f"{1 - used / paged:.1%}"
    )
    console.print(table)
    console.print(
        f"Paging wastes less than one block per request. In the memory the contiguous layout "
        f"needs for these 64 requests, paging fits about {reserved * 64 // paged} of them."
    )


if __name__ == "__main__":
    run(Console())
