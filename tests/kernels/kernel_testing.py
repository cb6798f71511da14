"""Shared builders for the kernel tests: random paged-KV batches and the hypothesis strategies.

(Named `kernel_testing`, not `helpers`: test folders here have no `__init__.py`, so pytest puts each
on sys.path and every module name must be unique across the whole tests tree.)

A batch is described by a small, printable `BatchSpec` (what hypothesis draws and shrinks) and
built into tensors by `build_batch`, deterministically from its seed. The cache is built to catch
kernels that read what they must not:

- physical blocks are a random permutation, so a kernel that assumes contiguous blocks fails;
- every cache slot that holds no context (spare blocks, the tail of a sequence's last block) is NaN,
  and so is a spare block that the padding of the block tables may point at: reading any of them
  turns the output NaN instead of slightly wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

# Per-dtype (atol, rtol) for kernel vs reference. The reference computes in float32 and rounds the
# output once; a kernel also rounds P to the input dtype before P @ V (as FlashAttention does),
# so half precision sees about one output ulp of difference.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOLERANCES[expected.dtype]
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


@dataclass(frozen=True)
class BatchSpec:
    seq_lens: tuple[int, ...]  # context length per sequence, this step's tokens included
    q_lens: tuple[int, ...]  # new (query) tokens per sequence, 1 <= q_len <= seq_len
    block_size: int
    num_kv_heads: int
    group: int  # query heads per kv head
    head_dim: int
    dtype: torch.dtype
    seed: int = 0
    table_padding: str = "minus_one"  # or "poisoned_block": a real block index full of NaN

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.group


@dataclass
class PagedBatch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    scale: float

    def args(self) -> tuple:
        """The positional arguments of `paged_attention` / `paged_attention_ref`."""
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            self.scale,
        )


def build_batch(spec: BatchSpec) -> PagedBatch:
    g = torch.Generator().manual_seed(spec.seed)
    bs, kvh, d = spec.block_size, spec.num_kv_heads, spec.head_dim
    blocks_per_seq = [-(-n // bs) for n in spec.seq_lens]
    spare = 2  # blocks no sequence owns (all NaN); the last one doubles as the poisoned padding
    num_blocks = sum(blocks_per_seq) + spare
    physical = torch.randperm(num_blocks, generator=g)
    poisoned_block = int(physical[-1])

    key_cache = torch.full((num_blocks, bs, kvh, d), float("nan"), dtype=spec.dtype)
    value_cache = torch.full_like(key_cache, float("nan"))
    pad = -1 if spec.table_padding == "minus_one" else poisoned_block
    width = max(blocks_per_seq) + 1  # at least one padding entry in every row
    block_tables = torch.full((len(spec.seq_lens), width), pad, dtype=torch.int32)
    used = 0
    for i, (seq_len, n_blocks) in enumerate(zip(spec.seq_lens, blocks_per_seq)):
        blocks = physical[used : used + n_blocks]
        used += n_blocks
        block_tables[i, :n_blocks] = blocks.to(torch.int32)
        # Fill exactly the slots of positions 0 .. seq_len - 1; the rest stays NaN.
        pos = torch.arange(seq_len)
        b, o = blocks[pos // bs], pos % bs
        key_cache[b, o] = torch.randn(seq_len, kvh, d, generator=g).to(spec.dtype)
        value_cache[b, o] = torch.randn(seq_len, kvh, d, generator=g).to(spec.dtype)

    num_tokens = sum(spec.q_lens)
    query = torch.randn(num_tokens, spec.num_heads, d, generator=g).to(spec.dtype)
    starts = [0]
    for q_len in spec.q_lens:
        starts.append(starts[-1] + q_len)
    return PagedBatch(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor(spec.seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        scale=d**-0.5,
    )


@st.composite
def batch_specs(
    draw,
    modes: tuple[str, ...] = ("decode", "prefill", "chunked", "mixed"),
    head_dims: tuple[int, ...] = (16, 32, 64),
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    block_sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
    groups: tuple[int, ...] = (1, 2, 4),
    max_seq_len: int = 80,
) -> BatchSpec:
    """Draw a batch: decode (q_len 1), prefill (q_len == seq_len), chunked prefill / prefix hit
    (1 <= q_len <= seq_len) or a mix of the three across sequences."""
    mode = draw(st.sampled_from(modes))
    block_size = draw(st.sampled_from(block_sizes))
    num_seqs = draw(st.integers(1, 3))
    seq_len_strategy = st.one_of(
        st.just(1),  # a single-token context
        # ending exactly at, just past, or just before a block boundary
        st.sampled_from([block_size, block_size + 1, 3 * block_size - 1, 4 * block_size]).filter(
            lambda n: 1 <= n <= max_seq_len
        ),
        st.integers(1, max_seq_len),  # anything, often spanning many blocks
    )
    seq_lens, q_lens = [], []
    for _ in range(num_seqs):
        seq_len = draw(seq_len_strategy)
        kind = draw(st.sampled_from(("decode", "prefill", "chunked"))) if mode == "mixed" else mode
        if kind == "decode":
            q_len = 1
        elif kind == "prefill":
            q_len = seq_len
        else:
            q_len = draw(st.integers(1, seq_len))
        seq_lens.append(seq_len)
        q_lens.append(q_len)
    return BatchSpec(
        seq_lens=tuple(seq_lens),
        q_lens=tuple(q_lens),
        block_size=block_size,
        num_kv_heads=draw(st.sampled_from((1, 2))),
        group=draw(st.sampled_from(groups)),
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**16)),
        table_padding=draw(st.sampled_from(("minus_one", "poisoned_block"))),
    )
