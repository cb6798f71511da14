"""Lesson 01 in the real engine: your `attention` computes every attention of the model.

`nanovllm lesson 1 --run` replaces the attention backend of each of the model's layers with one
that, for every sequence of every step (prefills, chunks and decodes alike), reads the sequence's
context out of the paged cache and hands it to your `attention`. (The engine's cache is paged,
lesson 02, so your contiguous `KVCache` stays in the lesson; the engine's own `store_kv` and
`gather_context` move K/V in and out of the pool.) The model has fewer KV heads than query heads
(grouped-query attention, lesson 04): each KV head is repeated for its group before your function
sees it.
"""

from __future__ import annotations

from nanovllm.lessons.plug import PerSequenceAttention, swap_attention
from nanovllm.models.attention import gather_context, store_kv

ENGINE: dict = {}
WORKLOAD = "batch"
COMPARE = None  # completions only: your attention's rounding may differ from the engine's
MOMENT = None  # nothing for the visualizer to show: attention is inside a step


def plug_in(engine, impl) -> list[str]:
    def make(num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        group = num_heads // num_kv_heads

        def attend(q, k, v):
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            return impl.attention(q, k, v, scale)

        return PerSequenceAttention(store_kv, gather_context, attend)

    layers = swap_attention(engine, make)
    return [f"attention: your `attention`, for every sequence in all {layers} layers"]
