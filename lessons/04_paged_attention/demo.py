"""Lesson 04 demo: the engine's paged attention, checked against contiguous attention.

1. A 37-token sequence is scattered over blocks of a pool full of stale data; the engine's
   `TorchAttention` decodes its last token through the block table. Same answer as attention
   over the contiguous sequence.
2. A batch of 32 decoding sequences: the engine's batched path (one padded gather for all)
   against a Python loop over sequences.

Run it: `nanovllm lesson 4 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nanovllm.models.attention import AttentionMetadata, TorchAttention, gather_context, store_kv

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 8, 2, 32, 8


def decode_metadata(block_tables: list[list[int]], seq_lens: list[int]) -> AttentionMetadata:
    """A step in which every sequence decodes one token (what the ModelRunner would build)."""
    n = len(seq_lens)
    width = max(len(t) for t in block_tables)
    slots = [
        t[(s - 1) // BLOCK_SIZE] * BLOCK_SIZE + (s - 1) % BLOCK_SIZE
        for t, s in zip(block_tables, seq_lens)
    ]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor(
            [t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32
        ),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens_list=seq_lens,
        query_lens_list=[1] * n,
        query_start_list=list(range(n + 1)),
        decode_seq_indices=torch.arange(n),
        decode_token_indices=torch.arange(n),
        prefill_seq_indices=[],
    )


def contiguous_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query [heads, d] over a contiguous [seq_len, kv_heads, d] context."""
    group = NUM_HEADS // NUM_KV_HEADS
    k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, seq_len, d]
    v = v.repeat_interleave(group, dim=1).transpose(0, 1)
    return F.scaled_dot_product_attention(q[:, None], k, v, scale=HEAD_DIM**-0.5)[:, 0]


def run(console: Console) -> None:
    torch.set_num_threads(1)  # small tensors: threads would only wait for each other
    torch.manual_seed(0)
    attn = TorchAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5)

    # --- 1. One sequence, scattered -----------------------------------------------------------
    seq_len, pool = 37, 16
    table = [11, 3, 14, 6, 0]  # 5 blocks of 8 hold 37 tokens; the last has 3 stale slots
    key_cache = torch.randn(pool, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM) * 50  # stale data everywhere
    value_cache = torch.randn(pool, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM) * 50
    k = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM)
    v = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM)
    slots = torch.tensor(
        [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(seq_len)]
    )
    store_kv(k, v, key_cache, value_cache, slots)  # the prefill and decodes that wrote them
    q = torch.randn(1, NUM_HEADS, HEAD_DIM)
    paged = attn.forward(
        q, k[-1:], v[-1:], key_cache, value_cache, decode_metadata([table], [seq_len])
    )
    expected = contiguous_attention(q[0], k, v)
    gathered_k, _ = gather_context(key_cache, value_cache, torch.tensor(table), seq_len)
    console.print(
        f"A {seq_len}-token sequence in blocks {escape(str(table))} of a {pool}-block pool "
        f"(block_size {BLOCK_SIZE}, {NUM_HEADS} query heads sharing {NUM_KV_HEADS} KV heads)."
    )
    console.print(f"  gather_context returns the keys in order: {torch.equal(gathered_k, k)}")
    console.print(
        f"  paged decode vs contiguous attention: max difference "
        f"{(paged[0] - expected).abs().max():.2e}"
    )
    console.print("  The 3 stale slots at the end of block 0 got weight exactly 0.\n")

    # --- 2. A batch of decodes ------------------------------------------------------------
    rng = random.Random(0)
    lens = [rng.randint(20, 300) for _ in range(16)]
    tables, free = [], list(range(1000))
    rng.shuffle(free)
    for n in lens:
        tables.append([free.pop() for _ in range(-(-n // BLOCK_SIZE))])
    key_cache = torch.randn(1000, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    value_cache = torch.randn_like(key_cache)
    meta = decode_metadata(tables, lens)
    q = torch.randn(len(lens), NUM_HEADS, HEAD_DIM)
    k_new = key_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)[meta.slot_mapping].clone()
    v_new = value_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)[meta.slot_mapping].clone()

    batched = attn.forward(q, k_new, v_new, key_cache, value_cache, meta)
    looped = torch.stack(
        [
            contiguous_attention(q[i], *gather_context(key_cache, value_cache, torch.tensor(t), n))
            for i, (t, n) in enumerate(zip(tables, lens))
        ]
    )
    width = meta.block_tables.shape[1]
    gathered = len(lens) * width * BLOCK_SIZE

    out = Table(title=f"One decode step for {len(lens)} sequences of 20-300 tokens")
    out.add_column("")
    out.add_column("", justify="right")
    out.add_row("block tables, padded to the longest", f"[{len(lens)}, {width}]")
    out.add_row("positions gathered (one padded read)", f"{gathered:,}")
    out.add_row("positions that belong to a sequence", f"{sum(lens):,}")
    out.add_row("masked to -inf before the softmax", f"{gathered - sum(lens):,}")
    out.add_row("max |batched - per-sequence loop|", f"{(batched - looped).abs().max():.2e}")
    console.print(out)
    console.print(
        "One read serves the whole batch, at the price of copying every context (and its "
        "padding) out of the cache. Lesson 05's kernel reads each block where it lies instead."
    )


if __name__ == "__main__":
    run(Console())
