"""The roofline: how fast this machine could serve the workload, from two rates measured here.

Two costs no engine can avoid: every token fed through the model multiplies through every
weight matrix (2 FLOPs per weight: a multiply and an add), and every decode step's attention
reads the K and V of every token in each running request's context. So:

    weight FLOPs  = 2 x layer_params x forwarded tokens + 2 x lm_head_params x output tokens
    KV bytes read = kv_bytes_per_token x (sum over decode steps of their context lengths)
    floor seconds = weight FLOPs / matmul rate + KV bytes read / copy bandwidth
    ceiling       = output tokens / floor seconds            (output tokens/s)

A request with `p` prompt and `o` output tokens forwards `p + o - 1` tokens (its last output is
returned, never fed back) and samples `o` times (the LM head runs on sampled rows only); its
decode steps feed outputs 1..o-1, step j reading the K/V of `p + j` tokens. The embedding is a
lookup, not a matmul. The two rates are measured at start-up with the bench's thread count
(one to three seconds): `measure_matmul` and `measure_copy` say how. Left out, so a real run is
slower: attention arithmetic, prefill attention's reads, norms, activations, sampling, Python,
scheduling. The two terms are added, not overlapped: within a step a CPU runs the matmuls and
the attention one after the other. README.md walks through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DTYPE_BYTES = 4  # the bench runs every engine in fp32


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, c: dict) -> ModelShape:
        heads = c["num_attention_heads"]
        return cls(
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            heads=heads,
            kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            intermediate=c["intermediate_size"],
            vocab=c["vocab_size"],
        )

    def layer_weights(self) -> list[tuple[int, int]]:
        """(out, in) of one decoder layer's matmuls: q, k, v, o, gate, up, down."""
        q, kv, h, m = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.intermediate,
        )
        return [(q, h), (kv, h), (kv, h), (h, q), (m, h), (m, h), (h, m)]

    @property
    def layer_params(self) -> int:
        return self.layers * sum(o * i for o, i in self.layer_weights())

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES


def workload_cost(shape: ModelShape, lengths: list[tuple[int, int]]) -> dict:
    """FLOPs and KV bytes the workload's (prompt, output) lengths imply, whatever the engine."""
    forwarded = sum(p + o - 1 for p, o in lengths)
    outputs = sum(o for _, o in lengths)
    kv_tokens = sum((o - 1) * p + (o - 1) * o // 2 for p, o in lengths)
    return {
        "forwarded_tokens": forwarded,
        "output_tokens": outputs,
        "weight_flops": 2 * shape.layer_params * forwarded + 2 * shape.lm_head_params * outputs,
        "kv_bytes_read": kv_tokens * shape.kv_bytes_per_token,
    }


def floor(cost: dict, matmul_flops: float, copy_bytes_per_s: float) -> dict:
    """Seconds at the measured rates, and the output tokens/s they allow."""
    compute_s = cost["weight_flops"] / matmul_flops
    memory_s = cost["kv_bytes_read"] / copy_bytes_per_s
    return {
        "compute_s": compute_s,
        "memory_s": memory_s,
        "floor_s": compute_s + memory_s,
        "ceiling_tok_s": cost["output_tokens"] / (compute_s + memory_s),
    }


def _best_seconds(fn, budget_s: float) -> float:
    """The fastest call, timed again and again for `budget_s` (at least 3 times, after a warm
    one): on a shared machine a neighbour only ever slows a call down, so the best is the rate."""
    fn()  # warm: first-call allocations and kernel choice are not the rate
    best, spent, reps = float("inf"), 0.0, 0
    while reps < 3 or (spent < budget_s and reps < 200):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent, reps = min(best, took), spent + took, reps + 1
    return best


@torch.inference_mode()
def measure_matmul(shape: ModelShape, rows: int) -> float:
    """FLOP/s of fp32 matmuls through one layer's weight shapes and the LM head's (random
    values: they do not change a matmul's cost), for a batch of `rows` tokens. Each shape takes
    the faster of `F.linear` and the product with a prepacked weight (`cpu_linear.py`: MKL's,
    else oneDNN's, what nanovllm runs on a CPU), so the rate is the best this machine was seen
    to do."""
    from nanovllm.backends.cpu_linear import can_prepack, linear, pack_weight, packing_library

    flops = seconds = 0.0
    for out_features, in_features in shape.layer_weights() + [(shape.vocab, shape.hidden)]:
        w = torch.randn(out_features, in_features)  # nn.Linear's layout: [out, in]
        x = torch.randn(rows, in_features)  # [rows, in]
        flops += 2 * rows * out_features * in_features
        best = _best_seconds(lambda: F.linear(x, w), 0.06)  # noqa: B023 - called here
        if can_prepack(w):
            packed = pack_weight(w, packing_library())
            best = min(best, _best_seconds(lambda: linear(x, w, None, packed), 0.06))  # noqa: B023
        seconds += best
    return flops / seconds


def measure_copy(nbytes: int = 64 * 2**20) -> float:
    """Bytes read plus written per second by `copy_` of one fp32 tensor into another: 128 MiB
    in all, larger than a CPU's last-level cache (README.md, "The roofline"), so it streams from
    memory."""
    src = torch.ones(nbytes // DTYPE_BYTES)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_seconds(lambda: dst.copy_(src), 0.2)


def for_workload(
    shape: ModelShape, lengths: list[tuple[int, int]], decode_rows: int, prefill_rows: int
) -> dict:
    """Measure the rates, then the workload's cost and floor: everything the report prints."""
    rates = measure(shape, decode_rows, prefill_rows)
    cost = workload_cost(shape, lengths)
    return {
        "layer_params": shape.layer_params,
        "lm_head_params": shape.lm_head_params,
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        **rates,
        **cost,
        **floor(cost, rates["matmul_flops"], rates["copy_bytes_per_s"]),
    }


def measure(shape: ModelShape, decode_rows: int, prefill_rows: int) -> dict:
    """This machine's matmul rate at the model's shapes, and its copy bandwidth. The matmul
    rate is the better of a decode batch's and a prefill chunk's, used for every token, so the
    floor stays a floor."""
    by_rows = {rows: measure_matmul(shape, rows) for rows in sorted({decode_rows, prefill_rows})}
    return {
        "matmul_flops_by_rows": by_rows,
        "matmul_flops": max(by_rows.values()),
        "copy_bytes_per_s": measure_copy(),
    }
