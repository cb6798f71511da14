"""fused_experts (Triton, interpreted on a CPU) against fused_experts_ref, and the sort behind it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from moe_testing import MoeSpec, assert_close, build_moe, moe_specs, route

pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")

from nanovllm.kernels.fused_moe import fused_experts, moe_align_block_size  # noqa: E402
from nanovllm.kernels.fused_moe_reference import fused_experts_ref  # noqa: E402

HALF = (torch.float32, torch.float16, torch.bfloat16)


@settings(max_examples=examples(30), deadline=None)
@given(spec=moe_specs(dtypes=HALF))
def test_fused_experts_matches_reference(spec: MoeSpec) -> None:
    case = build_moe(spec)
    assert_close(fused_experts(*case.args()), fused_experts_ref(*case.args()))


@settings(max_examples=examples(60), deadline=None)
@given(
    spec=moe_specs(max_tokens=70),
    block_size=st.sampled_from((1, 4, 16, 64)),
)
def test_moe_align_block_size_groups_every_pair_once(spec: MoeSpec, block_size: int) -> None:
    topk_ids = route(spec, torch.Generator().manual_seed(spec.seed)).to(spec.ids_dtype)
    flat = topk_ids.flatten().tolist()
    num_pairs, num_experts = len(flat), spec.num_experts
    sorted_ids, expert_ids, post_padded = moe_align_block_size(topk_ids, block_size, num_experts)
    sorted_ids, expert_ids = sorted_ids.tolist(), expert_ids.tolist()
    post_padded = int(post_padded.item())

    counts = [flat.count(e) for e in range(num_experts)]
    assert post_padded == sum(-(-c // block_size) * block_size for c in counts)
    assert len(sorted_ids) >= post_padded and len(expert_ids) * block_size >= len(sorted_ids)
    assert sorted(p for p in sorted_ids if p != num_pairs) == list(range(num_pairs))
    assert all(p == num_pairs for p in sorted_ids[post_padded:])
    for block, expert in enumerate(expert_ids):
        pairs = [p for p in sorted_ids[block * block_size : (block + 1) * block_size]]
        real = [p for p in pairs if p != num_pairs]
        if block * block_size >= post_padded:
            assert expert == -1 and not real
            continue
        assert real, f"block {block} holds only padding"
        assert all(flat[p] == expert for p in real)
        assert real == sorted(real)  # token order kept within an expert
    assert expert_ids[: post_padded // block_size] == sorted(
        expert_ids[: post_padded // block_size]
    )


def test_fused_experts_rejects_bad_arguments() -> None:
    case = build_moe(MoeSpec(3, 4, 2, 16, 16, "random"))
    x, w13, w2, weights, _ = case.args()
    with pytest.raises(ValueError, match="expert 7"):
        fused_experts(x, w13, w2, weights, torch.tensor([[0, 1], [7, 0], [1, 2]]))
    with pytest.raises(ValueError, match="BLOCK_SIZE_N=24"):
        fused_experts(*case.args(), block_sizes=(16, 24, 16))
    with pytest.raises(ValueError, match="BLOCK_SIZE_M=8"):
        fused_experts(*case.args(), block_sizes=(8, 16, 16))
    with pytest.raises(ValueError, match="w2 must be"):
        fused_experts(x, w13, w2[:3], weights, case.topk_ids)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [4, 300])  # decode (small M tiles), prefill (large)
def test_fused_experts_on_gpu(num_tokens: int) -> None:
    """Qwen3-30B-A3B's expert shapes (hidden 2048, intermediate 768, 128 experts, top-8)."""
    spec = MoeSpec(num_tokens, 128, 8, 2048, 768, "random", dtype=torch.bfloat16)
    case = build_moe(spec)
    args = [t.cuda() for t in case.args()]
    assert_close(fused_experts(*args), fused_experts_ref(*args))


@pytest.mark.gpu
def test_fused_experts_replays_in_a_cuda_graph() -> None:
    """Nothing in fused_experts reads a value back to the host while a graph is captured, so a
    captured call computes the routing it is replayed with."""
    spec = MoeSpec(8, 16, 2, 256, 128, "random", dtype=torch.bfloat16)
    static = [t.cuda() for t in build_moe(spec).args()]
    side = torch.cuda.Stream()  # warm up (compile the kernel) off the capturing stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fused_experts(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(*static)
    replayed = [t.cuda() for t in build_moe(replace(spec, seed=1)).args()]
    for dst, src in zip(static, replayed):
        dst.copy_(src)
    graph.replay()
    assert_close(out, fused_experts_ref(*replayed))
