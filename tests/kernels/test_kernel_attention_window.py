"""Sliding window and soft-capping in the fast attention paths, against the torch reference.

`CpuAttention` (the numba kernel), the plain `paged_attention_ref` it falls back to, and
`TritonAttention` (its kernel run by Triton's interpreter) must give what `TorchAttention` gives
with the same `sliding_window` and `logits_soft_cap`, on batches that mix fresh prefills, chunks
with cached context and decodes, with GQA and block sizes of every kind.

The kernels get block tables in which every block wholly before a sequence's first query's window
is a placeholder, as a sliding layer's table holds the null block once the window has moved past
a block (the hybrid KV cache manager's `remove_skipped_blocks`): a block full of NaN, or -1, an
id outside the cache. A kernel that reads one, or that ignores the window, returns NaN, raises,
or gives another answer. The reference reads the real blocks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kernel_testing import BatchSpec, assert_close, batch_specs, build_batch

from nanovllm.backends.cpu import CpuAttention
from nanovllm.executor.step_inputs import step_metadata
from nanovllm.kernels.cpu_paged_attention import cpu_fast_path_available, paged_attention_cpu
from nanovllm.kernels.reference import paged_attention_ref
from nanovllm.models.attention import AttentionMetadata, TorchAttention

windows = st.none() | st.just(1) | st.integers(2, 60)  # 1, shorter and longer than a context
soft_caps = st.none() | st.floats(0.5, 30.0)
placeholders = st.sampled_from(("nan_block", "minus_one"))


@dataclasses.dataclass
class WindowStep:
    """One step's inputs: `meta` reads the real blocks, `kernel_meta` the NaN block where the
    window has passed."""

    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    meta: AttentionMetadata
    kernel_meta: AttentionMetadata
    scale: float

    def expected(self, spec: BatchSpec, window: int | None, cap: float | None) -> torch.Tensor:
        attention = TorchAttention(
            spec.num_heads, spec.num_kv_heads, spec.head_dim, self.scale, window, cap
        )
        caches = self.key_cache.clone(), self.value_cache.clone()
        return attention.forward(self.q, self.k, self.v, *caches, self.meta)

    def kernel_args(self) -> tuple:
        """`paged_attention`'s positional arguments, over the kernel's block tables."""
        m = self.kernel_meta
        return (
            self.q,
            self.key_cache,
            self.value_cache,
            m.block_tables,
            m.seq_lens,
            m.query_start_loc,
            self.scale,
        )


def window_step(spec: BatchSpec, window: int | None, placeholder: str = "nan_block") -> WindowStep:
    """The step `spec` describes; `placeholder` ("nan_block" or "minus_one") fills the kernels'
    block tables where the window has passed, and their padding."""
    b = build_batch(spec)
    bs = spec.block_size
    # A block no sequence owns (build_batch leaves two, full of NaN), or no block at all.
    nan_block = int(torch.isnan(b.key_cache).flatten(1).all(1).nonzero()[0])
    null = nan_block if placeholder == "nan_block" else -1
    tables, positions = [], []
    kernel_tables = torch.full((len(spec.seq_lens), b.block_tables.shape[1]), null)
    for i, (seq_len, q_len) in enumerate(zip(spec.seq_lens, spec.q_lens)):
        num_blocks = -(-seq_len // bs)
        tables.append(b.block_tables[i, :num_blocks].tolist())
        positions += range(seq_len - q_len, seq_len)
        first_key = 0 if window is None else max(0, seq_len - q_len - window + 1)
        first_block = first_key // bs  # the blocks before it have left every query's window
        kernel_tables[i, first_block:num_blocks] = b.block_tables[i, first_block:num_blocks]
    _, meta = step_metadata(positions, list(spec.q_lens), list(spec.seq_lens), tables, bs)
    kernel_meta = dataclasses.replace(meta, block_tables=kernel_tables.to(torch.int32))
    # The new tokens' K/V are in the cache already; the forward passes store them again.
    flat = spec.num_kv_heads, spec.head_dim
    k = b.key_cache.view(-1, *flat)[meta.slot_mapping]
    v = b.value_cache.view(-1, *flat)[meta.slot_mapping]
    q = b.query * 4  # scores of a few units: the soft cap bends them
    return WindowStep(q, k, v, b.key_cache, b.value_cache, meta, kernel_meta, b.scale)


# A long decode, a chunk and a fresh prefill: windows end mid-block, tiles start in other blocks.
MIXED = BatchSpec(
    seq_lens=(45, 30, 13),
    q_lens=(1, 17, 13),
    block_size=4,
    num_kv_heads=2,
    group=3,
    head_dim=16,
    dtype=torch.float32,
)


# slow where numba's disk cache is cold (a fresh checkout): three versions of the kernel to
# compile, about 12 s; under a second once cached.
@pytest.mark.slow
@pytest.mark.skipif(not cpu_fast_path_available(), reason="numba is not installed")
@settings(max_examples=examples(40), deadline=None)
@given(
    spec=batch_specs(
        dtypes=(torch.float32,),
        head_dims=(8, 16, 32),
        block_sizes=(1, 3, 4, 16),
        groups=(1, 2, 3, 4),
        max_seq_len=48,
    ),
    window=windows,
    cap=soft_caps,
    placeholder=placeholders,
    q_tile=st.sampled_from((1, 3, 16)),
)
@example(spec=MIXED, window=7, cap=2.0, placeholder="nan_block", q_tile=3)
@example(spec=MIXED, window=1, cap=None, placeholder="minus_one", q_tile=16)
def test_the_cpu_kernel_honours_the_window_and_soft_cap(
    spec, window, cap, placeholder, q_tile
) -> None:
    step = window_step(spec, window, placeholder)
    expected = step.expected(spec, window, cap)
    attention = CpuAttention(
        spec.num_heads, spec.num_kv_heads, spec.head_dim, step.scale, window, cap
    )
    caches = step.key_cache.clone(), step.value_cache.clone()
    assert_close(attention.forward(step.q, step.k, step.v, *caches, step.kernel_meta), expected)
    options = {"sliding_window": window, "logits_soft_cap": cap}
    # Other query tiles (each starts its walk at its own first token's window), and the plain
    # reference that the kernel falls back to without numba.
    assert_close(paged_attention_cpu(*step.kernel_args(), q_tile=q_tile, **options), expected)
    assert_close(paged_attention_ref(*step.kernel_args(), **options), expected)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sliding_window": 0}, "sliding_window must be None or an int >= 1, got 0"),
        ({"sliding_window": 2.5}, "got 2.5"),
        ({"logits_soft_cap": 0.0}, "logits_soft_cap must be None or > 0, got 0.0"),
        ({"logits_soft_cap": -30.0}, "got -30.0"),
    ],
)
def test_a_bad_window_or_soft_cap_is_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CpuAttention(4, 2, 16, 0.25, **options)
    if cpu_fast_path_available():
        b = build_batch(MIXED)
        with pytest.raises(ValueError, match=message):
            paged_attention_cpu(*b.args(), **options)


triton_knobs = st.fixed_dictionaries(
    {"num_splits": st.sampled_from((1, 3)), "block_n": st.sampled_from((16, 32))}
)


@settings(max_examples=examples(8), deadline=None)
@given(
    spec=batch_specs(
        dtypes=(torch.float32,),
        head_dims=(16,),
        block_sizes=(1, 2, 4, 16),
        groups=(1, 2, 3),
        max_seq_len=32,
    ),
    window=windows,
    cap=soft_caps,
    placeholder=placeholders,
    knobs=triton_knobs,
)
@example(
    spec=MIXED, window=7, cap=2.0, placeholder="nan_block", knobs={"num_splits": 3, "block_n": 16}
)
def test_the_triton_kernel_honours_the_window_and_soft_cap(
    spec, window, cap, placeholder, knobs
) -> None:
    pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")
    from nanovllm.kernels.paged_attention import paged_attention

    step = window_step(spec, window, placeholder)
    expected = step.expected(spec, window, cap)
    # Split-KV (a split may hold no key of a row's window) and steps of 16 or 32 positions.
    options = {"sliding_window": window, "logits_soft_cap": cap, "block_m": 16, **knobs}
    assert_close(paged_attention(*step.kernel_args(), **options), expected)


@pytest.mark.parametrize(("window", "cap"), [(21, None), (5, 2.0)])
def test_triton_attention_honours_the_window_and_soft_cap(window, cap) -> None:
    pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")
    from nanovllm.backends.triton import TritonAttention

    step = window_step(MIXED, window)
    attention = TritonAttention(
        MIXED.num_heads, MIXED.num_kv_heads, MIXED.head_dim, step.scale, window, cap
    )
    caches = step.key_cache.clone(), step.value_cache.clone()
    out = attention.forward(step.q, step.k, step.v, *caches, step.kernel_meta)
    assert_close(out, step.expected(MIXED, window, cap))


def test_triton_attention_names_a_bad_window() -> None:
    pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")
    from nanovllm.backends.triton import TritonAttention

    with pytest.raises(ValueError, match="sliding_window must be None or an int >= 1, got -4"):
        TritonAttention(4, 2, 16, 0.25, sliding_window=-4)
