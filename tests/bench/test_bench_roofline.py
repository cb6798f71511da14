"""The roofline's arithmetic, against a case worked out by hand and a step-by-step count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanovllm.bench.roofline import ModelShape, floor, workload_cost

# hidden 8, 2 layers, 2 query heads and 1 KV head of 4, intermediate 16, vocabulary 10.
SHAPE = ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10)


def test_model_shape_by_hand() -> None:
    # per layer: q 8x8 + k 4x8 + v 4x8 + o 8x8 + gate 16x8 + up 16x8 + down 8x16 = 576
    assert SHAPE.layer_params == 2 * 576
    assert SHAPE.lm_head_params == 80
    # K and V, 2 layers, 1 KV head of 4, fp32: 2 * 2 * 1 * 4 * 4 bytes
    assert SHAPE.kv_bytes_per_token == 64
    config = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 16, "vocab_size": 10}  # fmt: skip
    # No head_dim: hidden / heads; no num_key_value_heads: one per query head.
    assert ModelShape.from_config(config) == ModelShape(8, 2, 2, 2, 4, 16, 10)
    assert ModelShape.from_config({**config, "num_key_value_heads": 1}) == SHAPE


def test_workload_cost_and_floor_by_hand() -> None:
    # Request A: prompt 3, 1 output (no decode step). Request B: prompt 2, 4 outputs; its decode
    # steps feed outputs 1, 2, 3 with 3, 4 and 5 tokens of context: 12 tokens of K/V read.
    cost = workload_cost(SHAPE, [(3, 1), (2, 4)])
    assert cost == {
        "forwarded_tokens": 3 + 5,  # p + o - 1 each
        "output_tokens": 5,
        "weight_flops": 2 * 1152 * 8 + 2 * 80 * 5,  # = 19,232
        "kv_bytes_read": 12 * 64,
    }
    f = floor(cost, matmul_flops=1000.0, copy_bytes_per_s=100.0)
    assert f["compute_s"] == pytest.approx(19.232)
    assert f["memory_s"] == pytest.approx(7.68)
    assert f["floor_s"] == pytest.approx(26.912)
    assert f["ceiling_tok_s"] == pytest.approx(5 / 26.912)


@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=8))
def test_closed_form_matches_counting_each_step(lengths) -> None:
    # Walk every request token by token: a prefill forwards the prompt and samples once; each
    # decode step forwards one token, reads the K/V of everything so far, and samples once.
    forwarded = sampled = kv_tokens = 0
    for prompt, output in lengths:
        forwarded, sampled, context = forwarded + prompt, sampled + 1, prompt
        for _ in range(output - 1):
            context += 1
            forwarded, sampled, kv_tokens = forwarded + 1, sampled + 1, kv_tokens + context
    cost = workload_cost(SHAPE, lengths)
    assert cost["forwarded_tokens"] == forwarded
    assert cost["output_tokens"] == sampled
    assert cost["weight_flops"] == 2 * (SHAPE.layer_params * forwarded + 80 * sampled)
    assert cost["kv_bytes_read"] == 64 * kv_tokens
