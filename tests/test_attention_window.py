"""The torch reference's sliding window and soft-capping against attention written out densely.

`TorchAttention(..., sliding_window=W, logits_soft_cap=c)`: a query at position p sees keys at
p - W + 1 .. p, and each scaled score s becomes c * tanh(s / c). The oracle here computes every
score of the whole context, caps it, masks it and takes the softmax, with no paging at all; the
reference must agree on a fresh prefill, a chunk with cached context, and a decode.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.models.attention import AttentionMetadata, TorchAttention

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 8, 4


def dense_attention(q, k, v, window, cap, scale):
    """[q_len, heads, head_dim]: the last q_len positions of a k/v context, attended densely."""
    kv_len = k.shape[0]
    q_pos = torch.arange(kv_len - q.shape[0], kv_len)[:, None]
    kv_pos = torch.arange(kv_len)[None, :]
    visible = kv_pos <= q_pos
    if window is not None:
        visible &= kv_pos > q_pos - window
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@settings(deadline=None)
@given(
    window=st.none() | st.integers(1, 12),
    cap=st.none() | st.floats(0.5, 50.0),
    seq_len=st.integers(1, 16),
    data=st.data(),
)
def test_window_and_soft_cap_match_dense_attention(window, cap, seq_len, data):
    q_len = data.draw(st.sampled_from(sorted({1, seq_len, max(1, seq_len // 2)})), "q_len")
    gen = torch.Generator().manual_seed(seq_len * 131 + q_len)
    k = torch.randn(seq_len, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(seq_len, KV_HEADS, HEAD_DIM, generator=gen)
    q = torch.randn(q_len, HEADS, HEAD_DIM, generator=gen) * 3
    key_cache = torch.randn(8, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    value_cache = torch.randn(8, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    block_table = torch.tensor([[6, 1, 4, 3]], dtype=torch.int32)
    slots = torch.tensor(
        [int(block_table[0, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in range(seq_len)]
    )
    cached = seq_len - q_len
    key_cache.view(-1, KV_HEADS, HEAD_DIM)[slots[:cached]] = k[:cached]
    value_cache.view(-1, KV_HEADS, HEAD_DIM)[slots[:cached]] = v[:cached]
    decode = q_len == 1 and seq_len > 1
    index = torch.tensor([0] if decode else [], dtype=torch.long)
    meta = AttentionMetadata(
        slot_mapping=slots[cached:],
        block_tables=block_table,
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        query_start_loc=torch.tensor([0, q_len], dtype=torch.int32),
        seq_lens_list=[seq_len],
        query_lens_list=[q_len],
        query_start_list=[0, q_len],
        decode_seq_indices=index,
        decode_token_indices=index,
        prefill_seq_indices=[] if decode else [0],
    )
    attention = TorchAttention(HEADS, KV_HEADS, HEAD_DIM, 0.3, window, cap)
    out = attention.forward(q, k[cached:], v[cached:], key_cache, value_cache, meta)
    torch.testing.assert_close(out, dense_attention(q, k, v, window, cap, 0.3))
