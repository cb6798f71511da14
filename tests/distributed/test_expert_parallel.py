"""Expert parallelism: the experts split over 2 gloo ranks give the output of all of them on one.

One group of 2 ranks (this process is rank 0, a spawned worker rank 1) serves the module; each
example's full weights and routing go to both ranks (`expert_parallel_checks`), which keep their
own experts and all-reduce. The oracle is `fused_experts_ref` on every expert in this process.
"""

from __future__ import annotations

import pytest
import torch
from budget import examples
from expert_parallel_checks import ExpertParallelChecks
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.distributed import WorkerGroup, get_tp_world_size
from nanovllm.distributed.expert_parallel import (
    expert_parallel_experts,
    local_expert_range,
    local_expert_weights,
)
from nanovllm.kernels.fused_moe_reference import fused_experts_ref

TOL = dict(atol=2e-5, rtol=2e-5)


@settings(max_examples=examples(50), deadline=None)
@given(num_experts=st.integers(1, 70), ep_size=st.integers(1, 9))
def test_local_expert_ranges_split_the_experts(num_experts: int, ep_size: int) -> None:
    if num_experts < ep_size:
        with pytest.raises(ValueError, match=f"num_experts={num_experts}"):
            local_expert_range(num_experts, 0, ep_size)
        return
    ranges = [local_expert_range(num_experts, r, ep_size) for r in range(ep_size)]
    assert [e for r in ranges for e in r] == list(range(num_experts))  # contiguous, in order
    sizes = [len(r) for r in ranges]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
    weight = torch.arange(num_experts).view(num_experts, 1, 1)
    for rank, experts in enumerate(ranges):
        assert local_expert_weights(weight, rank, ep_size).flatten().tolist() == list(experts)


def test_local_expert_range_rejects_bad_ranks() -> None:
    assert local_expert_range(10, 3, 4) == range(8, 10)  # 10 = 3 + 3 + 2 + 2
    with pytest.raises(ValueError, match="ep_rank 4"):
        local_expert_range(10, 4, 4)
    with pytest.raises(ValueError, match="ep_size must be >= 1, got 0"):
        local_expert_range(10, 0, 0)


@st.composite
def ep_cases(draw, max_tokens: int = 20):
    """Full weights and a routing in which each token's experts are all on rank 0, all on
    rank 1, or anywhere (with repeats); token counts include 0 and 1."""
    num_experts = draw(st.integers(2, 7))  # odd counts: rank 0 holds one more
    k = draw(st.integers(1, min(3, num_experts)))
    num_tokens = draw(st.integers(0, max_tokens))  # hypothesis tries 0 and 1 early
    hidden, inter = draw(st.sampled_from((16, 24))), draw(st.sampled_from((16, 20)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    halves = [local_expert_range(num_experts, r, 2) for r in (0, 1)]
    rows = []
    for _ in range(num_tokens):
        where = draw(st.sampled_from(("rank0", "rank1", "anywhere")))
        pool = {"rank0": halves[0], "rank1": halves[1], "anywhere": range(num_experts)}[where]
        rows.append([pool[int(i)] for i in torch.randint(0, len(pool), (k,), generator=g)])
    ids_dtype = draw(st.sampled_from((torch.int32, torch.int64)))
    return (
        torch.randn(num_tokens, hidden, generator=g),
        torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden**-0.5,
        torch.randn(num_experts, hidden, inter, generator=g) * inter**-0.5,
        torch.rand(num_tokens, k, generator=g),
        torch.tensor(rows, dtype=ids_dtype).view(num_tokens, k),
    )


@pytest.mark.usefixtures("one_torch_thread")  # tiny shapes
@settings(max_examples=examples(10), deadline=None)
@given(case=ep_cases())
def test_alone_the_one_rank_holds_every_expert(case) -> None:
    out = expert_parallel_experts(*case, first_expert=0)
    torch.testing.assert_close(out, fused_experts_ref(*case), **TOL)


@pytest.fixture(scope="module")
def ep2():
    with WorkerGroup(2, ExpertParallelChecks, timeout_s=60) as group:
        yield group
    assert get_tp_world_size() == 1  # closing left the process group


@settings(max_examples=examples(15), deadline=None)
@given(case=ep_cases(), explicit_group=st.booleans())
def test_two_ranks_equal_one(ep2, case, explicit_group: bool) -> None:
    expected = fused_experts_ref(*case)
    for out in ep2.run_all("experts", *case, explicit_group=explicit_group):
        torch.testing.assert_close(out, expected, **TOL)


@settings(max_examples=examples(3), deadline=None)
@given(case=ep_cases(max_tokens=40))
def test_two_ranks_with_the_triton_kernel(ep2, case) -> None:
    pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")
    expected = fused_experts_ref(*case)
    for out in ep2.run_all("experts", *case, kernel="triton"):
        torch.testing.assert_close(out, expected, **TOL)
