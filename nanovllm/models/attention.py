"""Paged attention in plain torch: write this step's K/V into the block cache, then attend
through the block tables.

A step's batch is *flat*: the new tokens of every scheduled request are concatenated, with no
padding. Request i owns query rows `query_start_loc[i] : query_start_loc[i + 1]`; its context
(everything already cached plus these new tokens) is `seq_lens[i]` tokens long and lives in the
physical blocks listed in `block_tables[i]`. Query token j of request i sits at position
`seq_lens[i] - q_len_i + j` and attends causally to positions 0 .. that position.

One interface, `forward(q, k, v, key_cache, value_cache, meta)`, serves every case the
scheduler produces:
- prefill      (q_len == seq_len: nothing cached before),
- chunked prefill and prefix-cache hits (1 < q_len < seq_len: part of the context is cached),
- decode       (q_len == 1).

`TorchAttention` first stores the new K/V through `slot_mapping`, so the cache is complete before
any request reads it, even a request that shares a block filled by another request in the same
step. Then fresh prefills attend over their own new K/V directly (no need to read them back from
the cache); decodes are batched into padded gathers through the block tables; chunks with
cached context gather their context per request. Every gather copies the context before it is
read. The kernels that read the cache in place (numba on a CPU, Triton on a GPU) implement the
same interface behind the backend seam (`nanovllm/backends/`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanovllm.models.soft_capping import soft_cap, soft_capped_attention


@dataclass
class AttentionMetadata:
    """Everything attention needs about the step's layout (built by the ModelRunner)."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int32: context length after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    # The same facts as Python lists, so the torch path can plan without device syncs.
    seq_lens_list: list[int]
    query_lens_list: list[int]
    query_start_list: list[int]
    decode_seq_indices: torch.Tensor  # [num_decodes] int64: sequences with q_len == 1
    decode_token_indices: torch.Tensor  # [num_decodes] int64: their rows in the flat batch
    prefill_seq_indices: list[int]  # sequences with q_len > 1
    # A hybrid model's (`core/kv_cache_interface.py`): each KV cache group's metadata (its block
    # tables and slot mapping), and each layer's group. Empty: every layer attends with this.
    kv_cache_groups: tuple[AttentionMetadata, ...] = ()
    layer_to_kv_cache_group: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    def for_layer(self, index: int) -> AttentionMetadata:
        """The metadata layer `index` attends with: its KV cache group's."""
        if not self.layer_to_kv_cache_group:
            return self
        return self.kv_cache_groups[self.layer_to_kv_cache_group[index]]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields that are tensors, by name (the ones a device needs)."""
        return {name: v for name, v in vars(self).items() if isinstance(v, torch.Tensor)}


class TorchAttention:
    """Paged attention in plain torch (see the module docstring)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # A query at position p sees keys at p - sliding_window + 1 .. p (None: all of 0 .. p).
        self.sliding_window = sliding_window
        # Each score s (after `scale`) becomes cap * tanh(s / cap) (`soft_capping.py`).
        self.logits_soft_cap = logits_soft_cap

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        store_kv(k, v, key_cache, value_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        if meta.decode_token_indices.numel():  # every decode at once
            rows, seqs = meta.decode_token_indices, meta.decode_seq_indices
            block_tables, seq_lens = meta.block_tables[seqs], meta.seq_lens[seqs]
            out[rows] = self._decode(q[rows], key_cache, value_cache, block_tables, seq_lens)
        for i in meta.prefill_seq_indices:
            start, q_len = meta.query_start_list[i], meta.query_lens_list[i]
            seq_len = meta.seq_lens_list[i]
            rows = slice(start, start + q_len)
            if q_len == seq_len:  # a fresh prefill: its whole context is the new tokens themselves
                ctx_k, ctx_v = k[rows], v[rows]
            else:  # part of the context is cached (an earlier chunk or a prefix-cache hit)
                ctx_k, ctx_v = gather_context(key_cache, value_cache, meta.block_tables[i], seq_len)
            out[rows] = self._sdpa(q[rows], ctx_k, ctx_v)
        return out

    def _sdpa(
        self,
        q: torch.Tensor,  # [q_len, num_heads, head_dim]: the context's last q_len positions
        k: torch.Tensor,  # [kv_len, num_kv_heads, head_dim]
        v: torch.Tensor,
    ) -> torch.Tensor:
        q_len, kv_len = q.shape[0], k.shape[0]
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)[:, None]
        kv_pos = torch.arange(kv_len, device=q.device)[None, :]
        visible = kv_pos <= q_pos  # [q_len, kv_len], True = attend: causal, and in the window
        if self.sliding_window is not None:
            visible &= kv_pos > q_pos - self.sliding_window
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, len, head_dim]
        if self.logits_soft_cap is not None:  # (torch's fused attention has no soft-capping)
            return soft_capped_attention(q, k, v, visible, self.scale, self.logits_soft_cap)
        causal = q_len == kv_len and self.sliding_window is None  # SDPA's own mask will do
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None if causal else visible,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out.transpose(0, 1)

    def _decode(
        self,
        q: torch.Tensor,  # [num_decodes, num_heads, head_dim]
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [num_decodes, max_blocks]
        seq_lens: torch.Tensor,  # [num_decodes]
    ) -> torch.Tensor:
        """Decoding requests at once: one gather through their block tables (padded, as the
        step's block tables are, to the longest in the step)."""
        block_size = key_cache.shape[1]
        num_decodes, max_blocks = block_tables.shape
        # [num_decodes, max_blocks * block_size, num_kv_heads, head_dim]
        keys = key_cache[block_tables].reshape(
            num_decodes, max_blocks * block_size, self.num_kv_heads, self.head_dim
        )
        # Slots past a request's length (the rest of its last block, and the padding up to the
        # longest block table) hold whatever an earlier request left there. Their scores
        # are masked to -inf below, so softmax gives them weight 0; but 0 x NaN is NaN, so a NaN
        # left in such a slot would still poison the output. Zero those values first.
        kv_pos = torch.arange(keys.shape[1], device=q.device)[None, :]
        invalid = kv_pos >= seq_lens[:, None]
        if self.sliding_window is not None:  # the query sits at seq_len - 1
            invalid |= kv_pos < (seq_lens - self.sliding_window)[:, None]
        values = value_cache[block_tables].reshape(keys.shape)
        values = values.masked_fill(invalid[:, :, None, None], 0.0)
        num_queries_per_kv = self.num_heads // self.num_kv_heads
        # [num_decodes, num_kv_heads, num_queries_per_kv, head_dim]: query heads by their KV head
        queries = q.view(num_decodes, self.num_kv_heads, num_queries_per_kv, self.head_dim)
        out = torch.empty_like(queries)
        # One batched matmul per KV head. `keys[:, :, h]` is a strided view ([n, L, head_dim]
        # with a row stride of num_kv_heads * head_dim) that BLAS reads in place: no copy.
        for h in range(self.num_kv_heads):
            k_h, v_h = keys[:, :, h], values[:, :, h]  # [n, L, head_dim]
            scores = torch.bmm(queries[:, h], k_h.transpose(1, 2)).float() * self.scale  # [n, g, L]
            if self.logits_soft_cap is not None:
                scores = soft_cap(scores, self.logits_soft_cap)
            scores.masked_fill_(invalid[:, None, :], float("-inf"))
            out[:, h] = torch.bmm(scores.softmax(dim=-1).to(v_h.dtype), v_h)  # [n, g, head_dim]
        return out.view(num_decodes, self.num_heads, self.head_dim)


def store_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens]
) -> None:
    """Write each new token's K and V into its slot (a view of the cache as one long row)."""
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_context(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks]
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's K and V for positions 0 .. seq_len-1, read through its block table."""
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    num_blocks = -(-seq_len // block_size)
    blocks = block_table[:num_blocks].long()
    keys = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
    values = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
    return keys, values  # [seq_len, num_kv_heads, head_dim] each
