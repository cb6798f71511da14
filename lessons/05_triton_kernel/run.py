"""Lesson 05 in the real engine: your two Triton kernels write and read the KV cache.

`nanovllm lesson 5 --run` builds the engine with an attention part (`attention_cls`) in each layer
whose K/V writes
are your `store_kvcache` kernel and whose decodes are your `paged_decode` kernel (a prefill
attends in plain PyTorch: the exercise has no prefill kernel). On a CPU the kernels run in
Triton's interpreter, thousands of times slower, so the run is 8 short completions. On a GPU
they are compiled and the run is the usual 64 completions.
"""

from __future__ import annotations

import torch

from nanovllm.engine.parts import EngineParts
from nanovllm.kernels import triton_setup
from nanovllm.lessons.plug import (
    PerSequenceAttention,
    causal_attention,
    count_your_attention,
    your_attention,
)
from nanovllm.models.attention import gather_context

triton_setup.configure()  # before anything imports triton

ENGINE = dict(device="cpu" if triton_setup.is_interpreted() else "cuda")
WORKLOAD = "short" if triton_setup.is_interpreted() else "batch"
COMPARE = None  # completions only: your kernels' rounding may differ from the engine's
MOMENT = None


def plug_in(impl) -> EngineParts:
    def make(num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        def decode(q, key_cache, value_cache, table, seq_len):
            seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=q.device)
            return impl.paged_decode(
                q, key_cache, value_cache, table[None].contiguous(), seq_lens, scale
            )

        def attend(q, k, v):
            return causal_attention(q, k, v, scale)

        return PerSequenceAttention(impl.store_kvcache, gather_context, attend, decode)

    return EngineParts(attention_cls=your_attention(make))


def swapped(engine) -> list[str]:
    layers = count_your_attention(engine)
    return [f"KV writes and decode attention: your two kernels, in all {layers} layers"]
