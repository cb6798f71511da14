"""The ceiling: how fast the model's linear layers alone could push the same tokens through.

Almost all of a transformer's arithmetic is in its linear layers (q, k, v, o, gate, up, down in
every layer, and the LM head for the rows that are sampled). Timing exactly those matmuls, for
exactly the step shapes nanovllm ran (tokens per step, sampled rows per step), gives a torch
floor for this schedule: no attention, no embedding, no norms, no Python, no scheduling. An
engine can only approach it; nanovllm's share of it says how much room is left.

The layers are the engine's own `nn.Linear` modules (same weights, same dtype, same torch);
the inputs are random of the right shape, which does not change a matmul's cost. Each distinct
step shape is timed once warm (best of three when it is quick) and multiplied by how many
steps had it, so the floor costs a fraction of the run it bounds.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

import torch


def _time_shape(model, num_tokens: int, num_sampled: int) -> float:
    args = model.args
    x = torch.randn(num_tokens, args.hidden_size)
    xa = torch.randn(num_tokens, args.num_attention_heads * args.head_dim)
    xm = torch.randn(num_tokens, args.intermediate_size)
    xs = torch.randn(num_sampled, args.hidden_size)
    dtype = model.lm_head.weight.dtype
    x, xa, xm, xs = (t.to(dtype) for t in (x, xa, xm, xs))

    def once() -> None:
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.q_proj(x)
            attn.k_proj(x)
            attn.v_proj(x)
            attn.o_proj(xa)
            mlp.gate_proj(x)
            mlp.up_proj(x)
            mlp.down_proj(xm)
        if num_sampled:
            model.lm_head(xs)

    once()  # warm: first-call allocations and kernel selection are not the floor
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - start)
        if best > 0.05:
            break  # long shapes are stable; one timing is enough
    return best


@torch.inference_mode()
def linear_floor(model, shapes: Iterable[tuple[int, int]]) -> dict:
    """Seconds the linear layers alone take for these (num_tokens, num_sampled) steps."""
    counts = Counter(shapes)
    total = 0.0
    for (num_tokens, num_sampled), count in counts.items():
        if num_tokens:
            total += count * _time_shape(model, num_tokens, num_sampled)
    return {"seconds": total, "num_steps": sum(counts.values()), "num_shapes": len(counts)}
