"""A step's estimated FLOPs and memory traffic, as vLLM estimates them for its MFU metrics.

vLLM's `vllm:estimated_flops_per_gpu_total`, `vllm:estimated_read_bytes_per_gpu_total` and
`vllm:estimated_write_bytes_per_gpu_total` (`vllm/v1/metrics/perf.py`) add up, every step, a
model of what the step's matmuls and attention do: not a measurement, arithmetic on the model's
shape and the step's batch. Divided by the elapsed time they give achieved TFLOP/s and GB/s:

    rate(vllm:estimated_flops_per_gpu_total[1m]) / 1e12

The batch is one `(num_tokens, context_len, is_prefill)` per request the step computed: the
tokens it ran and the request's context once they are in. With T = all the step's tokens, TC =
the sum of num_tokens x context_len, and per GPU (tensor parallelism splits the heads, the MLP's
intermediate size and the vocabulary) q query heads, kv key/value heads of d dimensions, hidden
size D, MLP size I, vocabulary V, L layers, these are vLLM's terms for a dense attention +
SwiGLU model (Llama, Qwen2, Qwen3), each over all L layers:

    FLOPs   q, k, v projections  2 T D (q + 2 kv) d      attention scores  2 q TC d
            output projection    2 T D q d               attention x V     2 q TC d
            MLP (gate, up, down) 2 T D 3 I               LM head           2 N D V
    where N = the prefills plus the decode tokens (the rows vLLM counts logits for).

Bytes read: every weight once per step, each layer's input activations, and the attention's
inputs (a prefill's queries and its context's keys and values as activations; a decode's
keys and values from the KV cache); bytes written: each layer's outputs and the new tokens' K
and V. One byte size for all (the model's dtype: nanovllm's KV cache and activations share it).
"""

from __future__ import annotations

from dataclasses import dataclass

from nanovllm.models.model_args import ModelArgs


@dataclass(frozen=True)
class StepPerf:
    flops: int
    read_bytes: int
    write_bytes: int


@dataclass(frozen=True)
class ModelShape:
    """The numbers the estimate reads, per GPU (one tensor-parallel rank's share)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    byte_size: int

    @classmethod
    def of(cls, args: ModelArgs, byte_size: int, tp_size: int = 1) -> ModelShape:
        return cls(
            num_layers=args.num_hidden_layers,
            hidden_size=args.hidden_size,
            num_heads=max(1, args.num_attention_heads // tp_size),
            num_kv_heads=max(1, args.num_key_value_heads // tp_size),
            head_dim=args.head_dim,
            intermediate_size=args.intermediate_size // tp_size,
            vocab_size=args.vocab_size // tp_size,
            byte_size=byte_size,
        )

    def step(self, batch: list[tuple[int, int, bool]]) -> StepPerf:
        """vLLM's estimate for one step that computed `batch`."""
        L, D, q, kv, d = (
            self.num_layers,
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
        )
        I, V, b = self.intermediate_size, self.vocab_size, self.byte_size  # noqa: E741
        T = sum(n for n, _, _ in batch)
        TC = sum(n * c for n, c, _ in batch)
        prefill_tokens = sum(n for n, _, p in batch if p)
        prefill_context = sum(c for _, c, p in batch if p)
        decode_tokens = T - prefill_tokens
        decode_context = sum(c for _, c, p in batch if not p)
        N = sum(1 for _, _, p in batch if p) + decode_tokens  # rows that get logits
        flops = (
            2 * T * D * (q + 2 * kv) * d * L  # q, k, v projections
            + 2 * T * D * q * d * L  # output projection
            + 2 * 2 * q * TC * d * L  # scores and scores x V
            + 2 * D * 3 * I * T * L  # gate, up, down
            + 2 * N * D * V  # LM head
        )
        attention_input = (prefill_tokens * q + 2 * prefill_context * kv) * d * b * L
        attention_input += (decode_tokens * q + 2 * decode_context * kv) * d * b * L
        read = (
            T * D * b * L + D * (q + 2 * kv) * d * b * L  # q, k, v: input, weights
            + attention_input
            + T * q * d * b * L + q * d * D * b * L  # output projection: input, weights
            + T * D * b * L + 2 * D * I * b * L  # gate and up: input, weights
            + 2 * T * I * b * L + T * I * b * L + D * I * b * L  # SiLU in, down: in, weights
            + N * D * b + D * V * b  # LM head: input, weights
        )  # fmt: skip
        write = (
            T * (q + 2 * kv) * d * b * L + 2 * T * kv * d * b * L + T * D * b * L  # attention
            + 2 * T * I * b * L + T * I * b * L + T * D * b * L  # MLP
            + N * V * b  # logits
        )  # fmt: skip
        return StepPerf(flops, read, write)
