"""store_kvcache (Triton, interpreted on a CPU) against store_kvcache_ref: a copy, so bit-exact."""

from __future__ import annotations

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_testing import DTYPES

pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")

from nanovllm.kernels.reference import store_kvcache_ref  # noqa: E402
from nanovllm.kernels.store_kvcache import store_kvcache  # noqa: E402


@st.composite
def store_cases(draw):
    block_size = draw(st.sampled_from((1, 2, 4, 8, 16)))
    num_blocks = draw(st.integers(1, 6))
    num_slots = num_blocks * block_size
    num_tokens = draw(st.integers(1, min(num_slots, 24)))
    slots = draw(st.permutations(range(num_slots)))[:num_tokens]  # distinct slots
    padding = draw(st.lists(st.booleans(), min_size=num_tokens, max_size=num_tokens))
    slots = [-1 if pad else s for s, pad in zip(slots, padding)]
    return dict(
        block_size=block_size,
        num_blocks=num_blocks,
        slots=slots,
        num_kv_heads=draw(st.integers(1, 3)),  # not only powers of two: the tile is padded
        head_dim=draw(st.sampled_from((8, 16, 64, 80, 128))),
        dtype=draw(st.sampled_from(DTYPES)),
        slot_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
        # K/V as views into one fused projection output, as a model produces them
        fused_qkv=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=examples(30), deadline=None)
@given(case=store_cases())
def test_store_kvcache_matches_reference(case: dict) -> None:
    g = torch.Generator().manual_seed(case["seed"])
    num_tokens, kvh, d = len(case["slots"]), case["num_kv_heads"], case["head_dim"]
    dtype = case["dtype"]
    if case["fused_qkv"]:  # [num_tokens, (2 + 2) * kvh * d]: q, k, v side by side
        qkv = torch.randn(num_tokens, 4 * kvh * d, generator=g).to(dtype)
        key = qkv[:, 2 * kvh * d : 3 * kvh * d].view(num_tokens, kvh, d)
        value = qkv[:, 3 * kvh * d :].view(num_tokens, kvh, d)
    else:
        key = torch.randn(num_tokens, kvh, d, generator=g).to(dtype)
        value = torch.randn(num_tokens, kvh, d, generator=g).to(dtype)
    shape = (case["num_blocks"], case["block_size"], kvh, d)
    key_cache = torch.randn(shape, generator=g).to(dtype)
    value_cache = torch.randn(shape, generator=g).to(dtype)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    slot_mapping = torch.tensor(case["slots"], dtype=case["slot_dtype"])

    store_kvcache_ref(key, value, expected_k, expected_v, slot_mapping)
    store_kvcache(key, value, key_cache, value_cache, slot_mapping)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_store_kvcache_all_padding_writes_nothing() -> None:
    key = torch.randn(3, 2, 16)
    key_cache = torch.zeros(2, 4, 2, 16)
    value_cache = torch.zeros(2, 4, 2, 16)
    store_kvcache(key, key, key_cache, value_cache, torch.full((3,), -1, dtype=torch.int32))
    assert not key_cache.any() and not value_cache.any()


def test_store_kvcache_rejects_mismatched_shapes_and_dtypes() -> None:
    cache = torch.zeros(2, 4, 2, 16)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="key must be"):
        store_kvcache(torch.zeros(2, 3, 16), torch.zeros(2, 2, 16), cache, cache.clone(), slots)
    with pytest.raises(ValueError, match="float16"):
        store_kvcache(
            torch.zeros(2, 2, 16, dtype=torch.float16),
            torch.zeros(2, 2, 16, dtype=torch.float16),
            cache,
            cache.clone(),
            slots,
        )
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kvcache(
            torch.zeros(2, 2, 16), torch.zeros(2, 2, 16), cache, cache.clone(), slots.float()
        )


@pytest.mark.gpu
def test_store_kvcache_on_gpu() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    key = torch.randn(300, 8, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    value = torch.randn_like(key)
    key_cache = torch.zeros(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.randperm(64 * 16, device="cuda")[:300]
    slots[::7] = -1
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    store_kvcache_ref(key, value, expected_k, expected_v, slots)
    store_kvcache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)
