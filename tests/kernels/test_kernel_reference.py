"""The oracle's oracle: the plain-torch references checked against independent computations.

`paged_attention_ref` is what every kernel is compared with, so it is itself compared with
`torch.nn.functional.scaled_dot_product_attention` on the same data laid out contiguously (gathered
position by position, not through the reference's own block-table code), and with cases whose
answer is known by hand.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from budget import examples
from hypothesis import given, settings
from kernel_testing import BatchSpec, batch_specs, build_batch

from nanovllm.kernels.reference import paged_attention_ref, store_kvcache_ref


def _contiguous_context(cache: torch.Tensor, table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[seq_len, num_kv_heads, head_dim], gathered one position at a time."""
    block_size = cache.shape[1]
    rows = [cache[int(table[p // block_size]), p % block_size] for p in range(seq_len)]
    return torch.stack(rows)


@settings(max_examples=examples(25), deadline=None)
@given(spec=batch_specs(dtypes=(torch.float32,), head_dims=(16, 32, 64, 128)))
def test_reference_matches_sdpa(spec: BatchSpec) -> None:
    b = build_batch(spec)
    out = paged_attention_ref(*b.args())
    starts = b.query_start_loc.tolist()
    for i, seq_len in enumerate(spec.seq_lens):
        q_len = spec.q_lens[i]
        k = _contiguous_context(b.key_cache, b.block_tables[i], seq_len)  # [L, kvh, d]
        v = _contiguous_context(b.value_cache, b.block_tables[i], seq_len)
        q = b.query[starts[i] : starts[i + 1]]  # [q_len, H, d]
        # Query j sits at position seq_len - q_len + j: a causal mask shifted by the cached prefix.
        mask = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=seq_len - q_len)
        expected = F.scaled_dot_product_attention(
            q.transpose(0, 1).double(),  # [H, q_len, d]
            k.transpose(0, 1).repeat_interleave(spec.group, 0).double(),  # [H, L, d]
            v.transpose(0, 1).repeat_interleave(spec.group, 0).double(),
            attn_mask=mask,
            scale=b.scale,
        ).transpose(0, 1)  # [q_len, H, d]
        torch.testing.assert_close(
            out[starts[i] : starts[i + 1]].double(), expected, atol=1e-5, rtol=1e-5
        )


def test_reference_single_token_context_returns_its_value() -> None:
    # With one context position the softmax is exactly [1.0]: the output is that position's V.
    spec = BatchSpec(
        (1, 1), (1, 1), block_size=4, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32
    )
    b = build_batch(spec)
    out = paged_attention_ref(*b.args())
    for i in range(2):
        v = b.value_cache[int(b.block_tables[i, 0]), 0]  # [kvh, d]
        torch.testing.assert_close(out[i], v.repeat_interleave(2, 0), atol=0, rtol=0)


def test_reference_equal_keys_average_the_values() -> None:
    # Identical keys give identical scores, so each query gets the plain mean of the values it sees.
    spec = BatchSpec(
        (6,), (3,), block_size=2, num_kv_heads=1, group=1, head_dim=16, dtype=torch.float32
    )
    b = build_batch(spec)
    table = b.block_tables[0]
    for p in range(6):
        b.key_cache[int(table[p // 2]), p % 2] = 1.0
    out = paged_attention_ref(*b.args())
    v = _contiguous_context(b.value_cache, table, 6)[:, 0]  # [6, d]
    for j in range(3):  # query j sits at position 3 + j and sees positions 0 .. 3 + j
        torch.testing.assert_close(out[j, 0], v[: 4 + j].mean(0), atol=1e-6, rtol=1e-6)


def test_store_kvcache_ref_writes_slots_and_skips_padding() -> None:
    cache_k = torch.zeros(3, 4, 2, 16)
    cache_v = torch.zeros(3, 4, 2, 16)
    key = torch.randn(3, 2, 16)
    value = torch.randn(3, 2, 16)
    store_kvcache_ref(key, value, cache_k, cache_v, torch.tensor([9, -1, 0]))
    torch.testing.assert_close(cache_k[2, 1], key[0])  # slot 9 = block 2, offset 1
    torch.testing.assert_close(cache_v[0, 0], value[2])  # slot 0
    written = cache_k.flatten(2).ne(0).any(-1).flatten()  # [num_slots]: which slots were written
    assert written.nonzero().flatten().tolist() == [0, 9]  # token 1 (slot -1) was skipped
