"""fused_experts_ref (the MoE oracle) against a dense computation of every expert on every token."""

from __future__ import annotations

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from moe_testing import MoeSpec, build_moe, dense_moe, moe_specs

from nanovllm.kernels.fused_moe_reference import fused_experts_ref


@settings(max_examples=examples(40), deadline=None)
@given(spec=moe_specs())
def test_reference_matches_dense_oracle(spec: MoeSpec) -> None:
    case = build_moe(spec)
    out = fused_experts_ref(*case.args())
    assert out.shape == (spec.num_tokens, spec.hidden) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), dense_moe(*case.args()), atol=2e-5, rtol=2e-5)


def test_reference_counts_an_expert_listed_twice_twice() -> None:
    case = build_moe(MoeSpec(3, 4, 1, 16, 16, "random"))
    once = fused_experts_ref(*case.args())
    twice = fused_experts_ref(
        case.hidden_states,
        case.w13,
        case.w2,
        case.topk_weights.repeat(1, 2),
        case.topk_ids.repeat(1, 2),
    )
    torch.testing.assert_close(twice, 2 * once)


def test_reference_rejects_bad_arguments() -> None:
    case = build_moe(MoeSpec(3, 4, 2, 16, 16, "random"))
    x, w13, w2, weights, ids = case.args()
    with pytest.raises(ValueError, match="outside 0..3"):
        fused_experts_ref(x, w13, w2, weights, torch.tensor([[0, 1], [4, 0], [1, 2]]))
    with pytest.raises(ValueError, match="expert -1"):
        fused_experts_ref(x, w13, w2, weights, torch.tensor([[0, 1], [-1, 0], [1, 2]]))
    with pytest.raises(ValueError, match="w2 must be"):
        fused_experts_ref(x, w13, w2[:, :, :8], weights, ids)
    with pytest.raises(ValueError, match="w13 must be"):
        fused_experts_ref(x, w13[:, :, :8], w2, weights, ids)
    with pytest.raises(ValueError, match="topk_weights must have"):
        fused_experts_ref(x, w13, w2, weights[:, :1], ids)
    with pytest.raises(ValueError, match="int32 or int64"):
        fused_experts_ref(x, w13, w2, weights, ids.float())
    with pytest.raises(ValueError, match="float16"):
        fused_experts_ref(x.half(), w13, w2, weights, ids)
