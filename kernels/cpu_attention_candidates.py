"""The other ways to do CPU paged attention that were measured against the numba kernel.

Kept so that `python -m nanovllm.kernels.bench --cpu --candidates` can repeat the measurement that
chose `cpu_paged_attention_numba` (figures and reasoning: kernels/README.md). Nothing in the engine
imports this module. All take the arguments of `paged_attention_cpu` and return its output:

- `gather_bmm`: the engine's torch path (nanovllm/executor/attention.py, `TorchAttention`, as of
  this writing): decodes sorted by context length and cut into groups of 16, each group's K/V
  gathered through the block table into a padded copy (`key_cache[block_tables]`), the padding's
  values zeroed, then one `bmm` per KV head; a sequence with more than one query token gathers its
  own context and runs SDPA, with a causal mask shifted by its cached prefix. (For a fresh prefill
  the engine runs SDPA on the step's new K/V without reading the cache; here that context is
  gathered from the cache first, a copy of q_len positions the engine does not make.)
- `inductor`: a torch formulation whose gather is plain indexing, compiled by `torch.compile`
  (dynamic shapes). Inductor fuses the indexing into its generated C++ loops, so K/V are not copied
  either, but it materialises the scores and is not an online softmax.
- `cpp`: the numba kernel's loops in C++ (`torch.utils.cpp_extension.load_inline`), parallel over
  the same work items with `at::parallel_for`, torch's own thread pool. Needs a C++ compiler, ninja
  and the Python headers at run time.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# gather + bmm (the engine's torch path)
# ---------------------------------------------------------------------------------------------


def gather_bmm(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    group = query.shape[1] // num_kv_heads
    out = torch.empty_like(query)
    lens, starts = seq_lens.tolist(), query_start_loc.tolist()
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    decodes = sorted((n, i) for i, n in enumerate(lens) if q_lens[i] == 1)
    for g in range(0, len(decodes), 16):
        members = decodes[g : g + 16]
        seqs = torch.tensor([i for _, i in members])
        rows = torch.tensor([starts[i] for _, i in members])
        num_blocks = -(-members[-1][0] // key_cache.shape[1])
        table = block_tables[seqs, :num_blocks].long()
        keys = key_cache[table].flatten(1, 2)  # [n, num_blocks * block_size, kvh, d]: a copy
        pad = torch.arange(keys.shape[1])[None, :] >= seq_lens[seqs][:, None]  # [n, L]
        # Slots past a context may hold NaN (0 * NaN = NaN after the softmax): zero them.
        values = value_cache[table].flatten(1, 2).masked_fill(pad[:, :, None, None], 0.0)
        q = query[rows].view(len(members), num_kv_heads, group, head_dim)
        o = torch.empty_like(q)
        for h in range(num_kv_heads):
            scores = torch.bmm(q[:, h], keys[:, :, h].transpose(1, 2)) * scale  # [n, g, L]
            scores.masked_fill_(pad[:, None, :], float("-inf"))
            o[:, h] = torch.bmm(scores.softmax(dim=-1), values[:, :, h])
        out[rows] = o.flatten(1, 2)
    for i, q_len in enumerate(q_lens):
        if q_len == 1:
            continue
        rows, seq_len = slice(starts[i], starts[i + 1]), lens[i]
        table = block_tables[i, : -(-seq_len // key_cache.shape[1])].long()
        k = key_cache[table].flatten(0, 1)[:seq_len].transpose(0, 1)  # [kvh, L, d]
        v = value_cache[table].flatten(0, 1)[:seq_len].transpose(0, 1)
        mask = None
        if q_len < seq_len:  # a chunk after cached context: the causal diagonal shifts
            mask = torch.ones(q_len, seq_len, dtype=torch.bool).tril(seq_len - q_len)
        out[rows] = F.scaled_dot_product_attention(
            query[rows].transpose(0, 1),
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=group > 1,
        ).transpose(0, 1)
    return out


# ---------------------------------------------------------------------------------------------
# torch.compile (inductor)
# ---------------------------------------------------------------------------------------------


def _attend_by_token(
    query: torch.Tensor,  # [T, num_heads, head_dim]
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_seq: torch.Tensor,  # [T]: each query token's sequence
    token_pos: torch.Tensor,  # [T]: each query token's position in it
    scale: float,
) -> torch.Tensor:
    """Every query token against positions 0 .. max context: [T, L] scores, masked causally."""
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    pos = torch.arange(block_tables.shape[1] * block_size)  # [L]
    valid = pos[None, :] <= token_pos[:, None]  # [T, L]
    block = torch.where(valid, block_tables[token_seq][:, pos // block_size].long(), 0)
    offset = (pos % block_size)[None, :]
    k = torch.where(valid[..., None, None], key_cache[block, offset], 0.0)  # [T, L, kvh, d]
    v = torch.where(valid[..., None, None], value_cache[block, offset], 0.0)
    q = query.view(num_tokens, 1, num_kv_heads, -1, head_dim) * scale  # [T, 1, kvh, g, d]
    scores = (q * k[:, :, :, None, :]).sum(-1)  # [T, L, kvh, g]
    scores = scores.masked_fill(~valid[..., None, None], float("-inf"))
    probs = scores.softmax(dim=1)
    out = (probs[..., None] * v[:, :, :, None, :]).sum(1)  # [T, kvh, g, d]
    return out.reshape(num_tokens, num_heads, head_dim)


@functools.cache
def _compiled():
    return torch.compile(_attend_by_token, dynamic=True)


def inductor(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    starts = query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    token_seq = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens)
    token_pos = torch.arange(query.shape[0]) - starts[token_seq] + (seq_lens - q_lens)[token_seq]
    # Trim the table to the longest context, so the kernel's L is that context, not the table.
    num_blocks = -(-int(seq_lens.max()) // key_cache.shape[1])
    table = block_tables[:, :num_blocks]
    return _compiled()(query, key_cache, value_cache, table, token_seq, token_pos, scale)


# ---------------------------------------------------------------------------------------------
# C++ (load_inline)
# ---------------------------------------------------------------------------------------------

_CPP_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// The numba kernel's loops (see cpu_paged_attention_numba.py), float32, int64 metadata.
at::Tensor paged_attention_cpp(at::Tensor query, at::Tensor key_cache, at::Tensor value_cache,
                               at::Tensor block_tables, at::Tensor seq_lens, at::Tensor qsl,
                               double scale, int64_t q_tile) {
  query = query.contiguous();
  auto out = at::empty_like(query);
  block_tables = block_tables.to(at::kLong).contiguous();
  seq_lens = seq_lens.to(at::kLong).contiguous();
  qsl = qsl.to(at::kLong).contiguous();
  const int64_t block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  const int64_t D = key_cache.size(3), group = query.size(1) / num_kv_heads;
  const int64_t *bt = block_tables.data_ptr<int64_t>(), *sl = seq_lens.data_ptr<int64_t>();
  const int64_t *qs = qsl.data_ptr<int64_t>(), bt_stride = block_tables.size(1);
  std::vector<int64_t> tile_seq, tile_first;
  for (int64_t s = 0; s < seq_lens.size(0); ++s)
    for (int64_t t = 0; t < qs[s + 1] - qs[s]; t += q_tile) {
      tile_seq.push_back(s);
      tile_first.push_back(t);
    }
  const float *qp = query.data_ptr<float>(), *kp = key_cache.data_ptr<float>();
  const float *vp = value_cache.data_ptr<float>();
  float *op = out.data_ptr<float>();
  const int64_t H = query.size(1), sc_b = key_cache.stride(0), sc_o = key_cache.stride(1);
  at::parallel_for(0, (int64_t)tile_seq.size() * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q, acc, m, l, sc(block_size);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item % num_kv_heads, s = tile_seq[item / num_kv_heads];
      const int64_t first = tile_first[item / num_kv_heads], q_start = qs[s];
      const int64_t q_len = qs[s + 1] - q_start, before = sl[s] - q_len;
      const int64_t last = std::min(first + q_tile, q_len), rows = (last - first) * group;
      q.assign(rows * D, 0.f);
      acc.assign(rows * D, 0.f);
      m.assign(rows, -std::numeric_limits<float>::infinity());
      l.assign(rows, 0.f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d)
          q[r * D + d] = qp[((q_start + first + r / group) * H + h * group + r % group) * D + d] * scale;
      for (int64_t b = 0; b * block_size < before + last; ++b) {
        const float *kb = kp + bt[s * bt_stride + b] * sc_b + h * D;
        const float *vb = vp + bt[s * bt_stride + b] * sc_b + h * D;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t visible = std::min(block_size, before + first + r / group + 1 - b * block_size);
          if (visible <= 0) continue;
          float m_new = m[r];
          for (int64_t t = 0; t < visible; ++t) {
            float x = 0.f;
            for (int64_t d = 0; d < D; ++d) x += q[r * D + d] * kb[t * sc_o + d];
            sc[t] = x;
            m_new = std::max(m_new, x);
          }
          const float alpha = std::exp(m[r] - m_new);
          float l_new = l[r] * alpha;
          for (int64_t d = 0; d < D; ++d) acc[r * D + d] *= alpha;
          for (int64_t t = 0; t < visible; ++t) {
            const float p = std::exp(sc[t] - m_new);
            l_new += p;
            for (int64_t d = 0; d < D; ++d) acc[r * D + d] += p * vb[t * sc_o + d];
          }
          m[r] = m_new;
          l[r] = l_new;
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d)
          op[((q_start + first + r / group) * H + h * group + r % group) * D + d] = acc[r * D + d] / l[r];
    }
  });
  return out;
}
"""


@functools.cache
def _cpp_module():
    from torch.utils.cpp_extension import load_inline

    flags = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fassociative-math"]
    flags += ["-fno-signed-zeros", "-fno-trapping-math"]  # what -fassociative-math needs
    return load_inline(
        "nanovllm_cpu_paged_attention_candidate",
        cpp_sources=_CPP_SOURCE,
        functions=["paged_attention_cpp"],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],  # resolves to the libgomp torch already loaded
    )


def cpp(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    group = query.shape[1] // key_cache.shape[2]
    q_tile = max(1, 32 // group)  # the numba kernel's default
    return _cpp_module().paged_attention_cpp(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, q_tile
    )
