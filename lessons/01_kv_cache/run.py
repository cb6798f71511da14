"""Lesson 01 in the real engine: your `attention` computes every prefill of the model, your
`KVCache` and `decode_step` every decode.

`nanovllm lesson 1 --run` builds the engine with an attention part (`attention_cls`) of its own in
each of the model's layers: one that, for every sequence of every step, reads the sequence's context out of the paged cache
(lesson 02: the engine's own `store_kv` and `gather_context` move K/V in and out of the pool).
A prefill or a chunk goes to your `attention`; a decode (one new token) fills one of your
`KVCache`s with the context before the new token and hands the new token to your
`decode_step`. The model has fewer KV heads than query heads (grouped-query attention, lesson
04): each KV head is repeated for its group before your code sees it.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import PerSequenceAttention, count_your_attention, your_attention
from nanovllm.models.attention import gather_context, store_kv

ENGINE: dict = {}
WORKLOAD = "batch"
COMPARE = None  # completions only: your attention's rounding may differ from the engine's
MOMENT = None  # nothing for the visualizer to show: attention is inside a step


def plug_in(impl) -> EngineParts:
    def make(num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        group = num_heads // num_kv_heads

        def attend(q, k, v):
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            return impl.attention(q, k, v, scale)

        def decode(q, key_cache, value_cache, table, seq_len):
            k, v = gather_context(key_cache, value_cache, table, seq_len)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            cache = impl.KVCache(num_heads, head_dim, dtype=k.dtype)
            cache.append(k[:-1], v[:-1])  # the context before the new token
            return impl.decode_step(cache, q, k[-1:], v[-1:], scale)

        return PerSequenceAttention(store_kv, gather_context, attend, decode)

    return EngineParts(attention_cls=your_attention(make))


def swapped(engine) -> list[str]:
    layers = count_your_attention(engine)
    return [
        f"prefill attention: your `attention`, for every sequence in all {layers} layers",
        f"decode attention: your `KVCache` and `decode_step`, in all {layers} layers",
    ]
