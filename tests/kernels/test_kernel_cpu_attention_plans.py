"""The CPU paged attention planned once per step against the plain call that plans every time.

`paged_attention_cpu_planned` with `plan_paged_attention_cpu`'s plan must give the bits of
`paged_attention_cpu` (the same kernel, the same work split; a decode-only step, which the planned
call sends to the C kernel where it is built, is compared here with that kernel turned off, and
tested against the reference in test_kernel_cpu_paged_attention_c.py); `CpuAttention` must make one plan
per step and configuration (`AttentionPlans`), and never run a step with an earlier step's plan:
new block tables (a block appended, a preempted request back with other blocks) and grown
sequence lengths must be read, or the output differs from the reference's.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kernel_testing import BatchSpec, assert_close, batch_specs, build_batch

from nanovllm.backends import cpu_attention_plans
from nanovllm.backends.cpu import CpuAttention
from nanovllm.backends.cpu_attention_plans import AttentionPlans
from nanovllm.kernels import cpu_paged_attention_c
from nanovllm.kernels.cpu_paged_attention import (
    cpu_fast_path_available,
    paged_attention_cpu,
    paged_attention_cpu_planned,
    plan_paged_attention_cpu,
)
from nanovllm.kernels.reference import paged_attention_ref
from nanovllm.models.attention import AttentionMetadata

pytestmark = pytest.mark.skipif(
    not cpu_fast_path_available(), reason="numba is not installed: no CPU fast path to test"
)

DECODES = BatchSpec(
    seq_lens=(33, 17, 46, 5),
    q_lens=(1,) * 4,
    block_size=4,
    num_kv_heads=2,
    group=2,
    head_dim=16,
    dtype=torch.float32,
)


def metadata(block_tables, seq_lens, query_start_loc) -> AttentionMetadata:
    """A step's metadata with the fields the CPU kernel reads (the rest unused)."""
    return AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64),
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        seq_lens_list=seq_lens.tolist(),
        query_lens_list=query_start_loc.diff().tolist(),
        query_start_list=query_start_loc.tolist(),
        decode_seq_indices=torch.empty(0, dtype=torch.int64),
        decode_token_indices=torch.empty(0, dtype=torch.int64),
        prefill_seq_indices=[],
    )


@settings(max_examples=examples(12), deadline=None)
@given(
    spec=batch_specs(dtypes=(torch.float32,), head_dims=(16, 32), block_sizes=(1, 4, 16)),
    window=st.none() | st.integers(1, 40),
    soft_cap=st.none() | st.floats(0.5, 30.0),
)
@example(spec=DECODES, window=None, soft_cap=None)
def test_the_planned_call_gives_the_plain_calls_bits(spec, window, soft_cap) -> None:
    b = build_batch(spec)
    q, kc, vc, bt, sl, qsl, scale = b.args()
    plan = plan_paged_attention_cpu(kc, bt, sl, qsl, q.shape[0], q.shape[1], sliding_window=window)
    with mock.patch.object(cpu_paged_attention_c, "applies", return_value=False):  # numba's bits
        planned = paged_attention_cpu_planned(q, kc, vc, plan, scale, logits_soft_cap=soft_cap)
    plain = paged_attention_cpu(*b.args(), sliding_window=window, logits_soft_cap=soft_cap)
    assert torch.equal(planned, plain)


def test_a_query_or_cache_the_plan_was_not_made_for_is_named() -> None:
    b = build_batch(DECODES)
    q, kc, vc, bt, sl, qsl, scale = b.args()
    plan = plan_paged_attention_cpu(kc, bt, sl, qsl, q.shape[0], q.shape[1])
    with pytest.raises(ValueError, match=r"query \(3, 4, 16\) .* do not fit the plan \(4 tokens"):
        paged_attention_cpu_planned(q[:3], kc, vc, plan, scale)
    with pytest.raises(ValueError, match="do not fit the plan .* of shape"):
        paged_attention_cpu_planned(q, kc[:-1], vc[:-1], plan, scale)
    with pytest.raises(ValueError, match="block table .* outside the cache's"):
        plan_paged_attention_cpu(kc, bt + 1000, sl, qsl, q.shape[0], q.shape[1])


def test_the_layers_of_a_step_share_one_plan(monkeypatch) -> None:
    made = []
    plan = cpu_attention_plans.plan_paged_attention_cpu
    monkeypatch.setattr(
        cpu_attention_plans,
        "plan_paged_attention_cpu",
        lambda *a, **k: made.append(a) or plan(*a, **k),
    )
    monkeypatch.setattr(CpuAttention, "plans", AttentionPlans())
    b = build_batch(DECODES)
    q, kc, vc, bt, sl, qsl, scale = b.args()
    meta = metadata(bt, sl, qsl)
    layers = [CpuAttention(4, 2, 16, scale) for _ in range(3)]
    outs = [layer.attend(q, kc, vc, meta) for layer in layers]
    assert len(made) == 1
    assert all(torch.equal(out, outs[0]) for out in outs)
    CpuAttention(4, 2, 16, scale, sliding_window=8).attend(q, kc, vc, meta)
    assert len(made) == 2  # (another window: another plan)


def test_a_new_step_never_runs_with_the_last_steps_plan(monkeypatch) -> None:
    monkeypatch.setattr(CpuAttention, "plans", AttentionPlans())
    b = build_batch(DECODES)
    q, kc, vc, bt, sl, qsl, scale = b.args()
    layer = CpuAttention(4, 2, 16, scale)
    # Every slot real, so that a plan with the last step's lengths or blocks gives other numbers.
    kc = torch.where(kc.isnan(), torch.randn_like(kc), kc)
    vc = torch.where(vc.isnan(), torch.randn_like(vc), vc)
    spare = sorted(set(range(kc.shape[0])) - set(bt.flatten().tolist()))
    moved, appended = bt.clone(), bt.clone()
    moved[1, :5] = bt[1, :5].flip(0)  # a preempted request, back with its blocks in another order
    appended[2, 12] = spare[0]  # sequence 2's 13th block
    grown, grown_more = sl + 1, sl + 1
    grown_more[2] += 3
    steps = ((bt, sl), (bt, grown), (moved, grown), (appended, grown_more))
    for step_bt, step_sl in steps:
        step_bt, step_sl, step_qsl = step_bt.clone(), step_sl.clone(), qsl.clone()  # a new step
        got = layer.attend(q, kc, vc, metadata(step_bt, step_sl, step_qsl))
        assert_close(got, paged_attention_ref(q, kc, vc, step_bt, step_sl, step_qsl, scale))
