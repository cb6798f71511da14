"""paged_attention (Triton, interpreted on a CPU) against paged_attention_ref.

One interface serves decode, prefill and chunked prefill, so the batches mix all three, with GQA,
several block sizes and head dims, a shuffled cache with NaN in every slot that must not be read,
and the kernel's own knobs (tile sizes, split-KV) drawn as well: none of them may change the answer.
"""

from __future__ import annotations

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kernel_testing import BatchSpec, assert_close, batch_specs, build_batch

pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")

from nanovllm.kernels.paged_attention import check_supported, paged_attention  # noqa: E402
from nanovllm.kernels.reference import paged_attention_ref, store_kvcache_ref  # noqa: E402
from nanovllm.kernels.store_kvcache import store_kvcache  # noqa: E402

knobs = st.fixed_dictionaries(
    {
        "num_splits": st.sampled_from((None, 1, 2, 3)),
        "block_m": st.sampled_from((None, 16, 32)),
        "block_n": st.sampled_from((None, 16, 32)),
    }
)

D128 = BatchSpec(
    (37, 5), (1, 5), block_size=16, num_kv_heads=2, group=4, head_dim=128, dtype=torch.bfloat16
)
CHUNK = BatchSpec(
    (70, 9, 1),
    (30, 1, 1),
    block_size=4,
    num_kv_heads=1,
    group=4,
    head_dim=64,
    dtype=torch.float16,
    table_padding="poisoned_block",
)
PREFILL = BatchSpec(
    (40, 33), (40, 20), block_size=8, num_kv_heads=2, group=1, head_dim=32, dtype=torch.float32
)


@settings(max_examples=examples(30), deadline=None)
@given(spec=batch_specs(), kw=knobs)
@example(spec=D128, kw={"num_splits": None, "block_m": None, "block_n": None})
@example(spec=D128, kw={"num_splits": 2, "block_m": 16, "block_n": 16})
@example(spec=CHUNK, kw={"num_splits": 3, "block_m": 16, "block_n": 16})
# A 32-query tile over 16-key steps, split three ways: some rows of a split see no key at all.
@example(spec=PREFILL, kw={"num_splits": 3, "block_m": 32, "block_n": 16})
def test_paged_attention_matches_reference(spec: BatchSpec, kw: dict) -> None:
    b = build_batch(spec)
    expected = paged_attention_ref(*b.args())
    out = paged_attention(*b.args(), **kw)
    assert_close(out, expected)


@settings(max_examples=examples(6), deadline=None)
@given(spec=batch_specs(groups=(3,), dtypes=(torch.float32,)))
def test_paged_attention_group_not_a_power_of_two(spec: BatchSpec) -> None:
    # GQA groups of 3 (or 7, ...) are padded to 4 rows per token inside the tile.
    b = build_batch(spec)
    assert_close(paged_attention(*b.args()), paged_attention_ref(*b.args()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_single_token_context_returns_its_value(dtype: torch.dtype) -> None:
    spec = BatchSpec(
        (1, 1), (1, 1), block_size=2, num_kv_heads=2, group=2, head_dim=32, dtype=dtype
    )
    b = build_batch(spec)
    out = paged_attention(*b.args())
    for i in range(2):
        v = b.value_cache[int(b.block_tables[i, 0]), 0].repeat_interleave(2, 0)  # [H, d]
        torch.testing.assert_close(out[i], v, atol=0, rtol=0)


def test_max_query_len_hint_gives_the_same_answer() -> None:
    b = build_batch(CHUNK)
    assert_close(paged_attention(*b.args(), max_query_len=30), paged_attention_ref(*b.args()))


def test_engine_step_sequence_store_then_attend() -> None:
    """What the engine does each step: store the new tokens' K/V, then attend over the cache.

    Two sequences: a 13-token prompt prefilled in chunks of 8 and 5 while a 6-token prompt is
    prefilled whole, then two decode steps for both; the cache starts empty (zeros) and only
    store_kvcache fills it.
    """
    g = torch.Generator().manual_seed(1)
    block_size, kvh, group, d = 4, 2, 2, 32
    key_cache = torch.zeros(12, block_size, kvh, d)
    value_cache = torch.zeros_like(key_cache)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    block_tables = torch.tensor([[7, 2, 9, 4, 11], [0, 5, 3, -1, -1]], dtype=torch.int32)
    done = [0, 0]  # tokens already in the cache per sequence
    for new in ([8, 6], [5, 1], [1, 1], [1, 1]):
        slots, starts = [], [0]
        for i, n in enumerate(new):
            for pos in range(done[i], done[i] + n):
                slots.append(
                    int(block_tables[i, pos // block_size]) * block_size + pos % block_size
                )
            starts.append(starts[-1] + n)
        num_tokens = starts[-1]
        key = torch.randn(num_tokens, kvh, d, generator=g)
        value = torch.randn(num_tokens, kvh, d, generator=g)
        query = torch.randn(num_tokens, kvh * group, d, generator=g)
        slot_mapping = torch.tensor(slots, dtype=torch.int64)
        store_kvcache(key, value, key_cache, value_cache, slot_mapping)
        store_kvcache_ref(key, value, expected_k, expected_v, slot_mapping)
        done = [done[i] + new[i] for i in range(2)]
        seq_lens = torch.tensor(done, dtype=torch.int32)
        qsl = torch.tensor(starts, dtype=torch.int32)
        out = paged_attention(query, key_cache, value_cache, block_tables, seq_lens, qsl, d**-0.5)
        ref = paged_attention_ref(
            query, expected_k, expected_v, block_tables, seq_lens, qsl, d**-0.5
        )
        assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)
        assert_close(out, ref)


def test_check_supported() -> None:
    check_supported(16, 128)
    with pytest.raises(ValueError, match="block_size=12"):
        check_supported(12, 128)
    with pytest.raises(ValueError, match="head_dim=96"):
        check_supported(16, 96)


@pytest.mark.parametrize("block_size", [3, 12, 512])
def test_unsupported_block_size_raises(block_size: int) -> None:
    b = build_batch(
        BatchSpec(
            (5,), (1,), block_size=4, num_kv_heads=1, group=1, head_dim=16, dtype=torch.float32
        )
    )
    cache = torch.zeros(2, block_size, 1, 16)
    with pytest.raises(ValueError, match=f"block_size={block_size}"):
        paged_attention(b.query, cache, cache.clone(), *b.args()[3:])


@pytest.mark.parametrize("head_dim", [8, 80, 512])
def test_unsupported_head_dim_raises(head_dim: int) -> None:
    query = torch.zeros(1, 1, head_dim)
    cache = torch.zeros(2, 4, 1, head_dim)
    table = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    qsl = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=f"head_dim={head_dim}"):
        paged_attention(query, cache, cache.clone(), table, lens, qsl, 1.0)


def test_bad_arguments_raise() -> None:
    b = build_batch(
        BatchSpec(
            (5,), (2,), block_size=4, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32
        )
    )
    q, kc, vc, bt, sl, qsl, scale = b.args()
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(q[:, :3], kc, vc, bt, sl, qsl, scale)
    with pytest.raises(ValueError, match="float16"):
        paged_attention(q.half(), kc, vc, bt, sl, qsl, scale)
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_attention(q, kc, vc, bt, sl, qsl[:1], scale)
    with pytest.raises(ValueError, match="block_m"):
        paged_attention(q, kc, vc, bt, sl, qsl, scale, block_m=8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_paged_attention_on_gpu(dtype: torch.dtype, head_dim: int, block_size: int) -> None:
    """Compiled kernels on a real GPU: long contexts, many sequences, automatic split-KV."""
    for seq_lens, q_lens in [
        ((1, 1000, 4097, 17), (1, 1, 1, 1)),  # decode (split-KV for a small batch)
        ((600, 129), (600, 129)),  # prefill
        ((3000, 700, 1), (300, 1, 1)),  # chunked prefill + decode
    ]:
        spec = BatchSpec(
            seq_lens, q_lens, block_size, num_kv_heads=8, group=4, head_dim=head_dim, dtype=dtype
        )
        b = build_batch(spec)
        cuda = [t.cuda() if isinstance(t, torch.Tensor) else t for t in b.args()]
        assert_close(paged_attention(*cuda).cpu(), paged_attention_ref(*b.args()))
