"""paged_attention_naive (Triton, interpreted on a CPU) against paged_attention_ref, decode only."""

from __future__ import annotations

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from kernel_testing import BatchSpec, assert_close, batch_specs, build_batch

pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")

from nanovllm.kernels.paged_attention_naive import paged_attention_naive  # noqa: E402
from nanovllm.kernels.reference import paged_attention_ref  # noqa: E402


@settings(max_examples=examples(25), deadline=None)
@given(spec=batch_specs(modes=("decode",)))
@example(
    spec=BatchSpec(
        (1, 45, 16),
        (1, 1, 1),
        block_size=8,
        num_kv_heads=2,
        group=4,
        head_dim=128,
        dtype=torch.float16,
    )
)
def test_naive_decode_matches_reference(spec: BatchSpec) -> None:
    b = build_batch(spec)
    q, kc, vc, bt, sl, _, scale = b.args()
    assert_close(paged_attention_naive(q, kc, vc, bt, sl, scale), paged_attention_ref(*b.args()))


def test_naive_rejects_more_than_one_query_token_per_sequence() -> None:
    b = build_batch(
        BatchSpec(
            (5,), (2,), block_size=4, num_kv_heads=1, group=1, head_dim=16, dtype=torch.float32
        )
    )
    q, kc, vc, bt, sl, _, scale = b.args()
    with pytest.raises(ValueError, match="decode only"):
        paged_attention_naive(q, kc, vc, bt, sl, scale)


@pytest.mark.parametrize("block_size", [3, 512])
def test_naive_unsupported_block_size_raises(block_size: int) -> None:
    cache = torch.zeros(2, block_size, 1, 16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"block_size={block_size}"):
        paged_attention_naive(
            torch.zeros(1, 1, 16),
            cache,
            cache.clone(),
            table,
            torch.ones(1, dtype=torch.int32),
            1.0,
        )


@pytest.mark.gpu
def test_naive_on_gpu() -> None:
    spec = BatchSpec(
        (1, 1000, 4097),
        (1, 1, 1),
        block_size=16,
        num_kv_heads=8,
        group=4,
        head_dim=128,
        dtype=torch.bfloat16,
    )
    b = build_batch(spec)
    q, kc, vc, bt, sl, _, scale = (t.cuda() if isinstance(t, torch.Tensor) else t for t in b.args())
    assert_close(
        paged_attention_naive(q, kc, vc, bt, sl, scale).cpu(), paged_attention_ref(*b.args())
    )
