"""Lesson 04 in the real engine: your paged decode attention runs every decode of the model.

`nanovllm lesson 4 --run` builds the engine with an attention part (`attention_cls`) in each layer
that, for every
decoding sequence, calls your `paged_decode` on the real paged cache and the sequence's real
block table, and, for a prefill whose context is partly cached, reads that context with your
`gather_kv`. (A fresh prefill attends over its own new K/V: the engine's way.)
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import (
    PerSequenceAttention,
    causal_attention,
    count_your_attention,
    your_attention,
)
from nanovllm.models.attention import store_kv

ENGINE = dict(max_num_batched_tokens=64)  # chunked prefills: context read back by gather_kv
WORKLOAD = "batch"
COMPARE = None  # completions only: your attention's rounding may differ from the engine's
MOMENT = "scattered_reads"  # attention hops over a decode's scattered blocks (executor panel)


def plug_in(impl) -> EngineParts:
    def make(num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        def gather(key_cache, value_cache, table, seq_len):
            return impl.gather_kv(key_cache, value_cache, table.tolist(), seq_len)

        def decode(q, key_cache, value_cache, table, seq_len):
            out = impl.paged_decode(q[0], key_cache, value_cache, table.tolist(), seq_len, scale)
            return out[None]

        def attend(q, k, v):
            return causal_attention(q, k, v, scale)

        return PerSequenceAttention(store_kv, gather, attend, decode)

    return EngineParts(attention_cls=your_attention(make))


def swapped(engine) -> list[str]:
    layers = count_your_attention(engine)
    return [f"decode attention: your `paged_decode` and `gather_kv`, in all {layers} layers"]
