"""paged_attention_cpu (numba, in place) against paged_attention_ref.

The batches mix decode, prefill and chunked prefill, with GQA groups 1-4 (3 too: the 100M-class
models' 12 heads over 4 KV heads), head dims and block sizes the Triton kernels do not serve,
shuffled blocks, and NaN in every cache slot a query must not read: one read past seq_len turns
the output NaN. The query tile size is drawn too: it must not change the answer.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kernel_testing import BatchSpec, assert_close, batch_specs, build_batch

from nanovllm.kernels import cpu_paged_attention
from nanovllm.kernels.cpu_paged_attention import cpu_fast_path_available, paged_attention_cpu
from nanovllm.kernels.reference import paged_attention_ref

pytestmark = pytest.mark.skipif(
    not cpu_fast_path_available(), reason="numba is not installed: no CPU fast path to test"
)

# The engine's shapes: the embedded model's decode (4 heads over 2 KV heads, head_dim 64, block 16)
# and a chunked prefill beside decodes of a 12-head, 4-KV-head model.
EMBEDDED_DECODE = BatchSpec(
    seq_lens=(100, 257, 500, 31, 16, 17),
    q_lens=(1,) * 6,
    block_size=16,
    num_kv_heads=2,
    group=2,
    head_dim=64,
    dtype=torch.float32,
    table_padding="poisoned_block",
)
CHUNK_AND_DECODES = BatchSpec(
    seq_lens=(200, 64, 129),
    q_lens=(72, 1, 1),
    block_size=16,
    num_kv_heads=4,
    group=3,
    head_dim=64,
    dtype=torch.float32,
)


@pytest.mark.quick
@settings(max_examples=examples(40), deadline=None)
@given(
    spec=batch_specs(
        dtypes=(torch.float32,),
        head_dims=(16, 32, 64, 80, 128),
        block_sizes=(1, 3, 4, 16),
        groups=(1, 2, 3, 4),
    ),
    q_tile=st.sampled_from((None, 1, 3, 16)),
    all_kv_heads=st.sampled_from((None, False, True)),  # per item (None: the wrapper's choice)
)
@example(spec=EMBEDDED_DECODE, q_tile=None, all_kv_heads=None)
@example(spec=CHUNK_AND_DECODES, q_tile=None, all_kv_heads=None)
@example(spec=CHUNK_AND_DECODES, q_tile=5, all_kv_heads=True)
def test_matches_reference(spec: BatchSpec, q_tile: int | None, all_kv_heads: bool | None) -> None:
    b = build_batch(spec)
    kv_per_item = None if all_kv_heads is None else spec.num_kv_heads if all_kv_heads else 1
    out = paged_attention_cpu(*b.args(), q_tile=q_tile, kv_per_item=kv_per_item)
    assert_close(out, paged_attention_ref(*b.args()))


def test_how_heads_are_split_into_items_changes_no_bit() -> None:
    # A row's arithmetic is the same whichever item holds it: only the memory it shares differs.
    b = build_batch(CHUNK_AND_DECODES)  # 4 KV heads
    outs = [paged_attention_cpu(*b.args(), kv_per_item=n) for n in (1, 2, 4, None)]
    assert all(torch.equal(outs[0], out) for out in outs[1:])


@pytest.mark.parametrize("bad", [0, 3, 5])
def test_a_kv_per_item_that_does_not_divide_the_kv_heads_is_named(bad: int) -> None:
    b = build_batch(CHUNK_AND_DECODES)
    with pytest.raises(ValueError, match=f"kv_per_item={bad} must divide num_kv_heads=4"):
        paged_attention_cpu(*b.args(), kv_per_item=bad)


def test_two_threads_give_the_same_bits_as_one() -> None:
    # Each work item is one thread's work, summed in a fixed order: the thread count
    # (and which thread ran what) cannot change a bit. (The tests' conftest runs at 1 thread.)
    b = build_batch(CHUNK_AND_DECODES)
    one = paged_attention_cpu(*b.args())
    torch.set_num_threads(2)  # restored by conftest's autouse fixture
    two = paged_attention_cpu(*b.args())
    assert torch.equal(one, two)


def test_the_first_call_leaves_torch_thread_count_alone() -> None:
    # numba starts its threads on its first parallel call, in a fresh process: so run one.
    code = (
        "import torch\n"
        "from nanovllm.kernels.cpu_paged_attention import paged_attention_cpu\n"
        "torch.set_num_threads(1)\n"
        "q, kc = torch.randn(1, 2, 16), torch.randn(2, 4, 1, 16)\n"
        "t = torch.tensor([[0, 1]], dtype=torch.int32)\n"
        "l, s = torch.tensor([5], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)\n"
        "paged_attention_cpu(q, kc, kc, t, l, s, 0.25)\n"
        "print(torch.get_num_threads())\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="2", NUMBA_NUM_THREADS="2")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1"]


def test_a_sequence_gets_the_same_bits_alone_and_in_a_batch() -> None:
    b = build_batch(CHUNK_AND_DECODES)
    batched = paged_attention_cpu(*b.args())
    starts = b.query_start_loc.tolist()
    for i in range(len(starts) - 1):
        rows = slice(starts[i], starts[i + 1])
        alone = paged_attention_cpu(
            b.query[rows],
            b.key_cache,
            b.value_cache,
            b.block_tables[i : i + 1],
            b.seq_lens[i : i + 1],
            torch.tensor([0, starts[i + 1] - starts[i]], dtype=torch.int32),
            b.scale,
        )
        assert torch.equal(alone, batched[rows])


def test_reads_a_strided_query_and_writes_into_out() -> None:
    # The engine's query is a view into the QKV projection; `out` may be a slice of a larger buffer.
    b = build_batch(EMBEDDED_DECODE)
    num_tokens, num_heads, head_dim = b.query.shape
    qkv = torch.randn(num_tokens, 2 * num_heads, head_dim)
    qkv[:, :num_heads] = b.query
    query = qkv[:, :num_heads]  # not contiguous
    expected = paged_attention_ref(*b.args())
    out = torch.full((num_tokens, num_heads, head_dim), float("nan"))
    assert paged_attention_cpu(query, *b.args()[1:], out=out) is out
    assert_close(out, expected)
    wide = torch.full((num_tokens, 2 * num_heads, head_dim), float("nan"))
    paged_attention_cpu(query, *b.args()[1:], out=wide[:, num_heads:])  # a strided `out`
    assert_close(wide[:, num_heads:], expected)
    assert wide[:, :num_heads].isnan().all()


def test_int64_metadata_and_an_empty_batch() -> None:
    b = build_batch(CHUNK_AND_DECODES)
    q, kc, vc, bt, sl, qsl, scale = b.args()
    assert_close(
        paged_attention_cpu(q, kc, vc, bt.long(), sl.long(), qsl.long(), scale),
        paged_attention_ref(*b.args()),
    )
    empty = paged_attention_cpu(
        q[:0], kc, vc, bt[:0], sl[:0], torch.zeros(1, dtype=torch.int32), scale
    )
    assert empty.shape == (0, q.shape[1], q.shape[2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_dtypes_run_the_reference(dtype: torch.dtype) -> None:
    assert not cpu_fast_path_available(dtype)
    spec = BatchSpec(
        (20, 7), (1, 7), block_size=4, num_kv_heads=2, group=2, head_dim=32, dtype=dtype
    )
    b = build_batch(spec)
    assert torch.equal(paged_attention_cpu(*b.args()), paged_attention_ref(*b.args()))


def test_without_numba_one_notice_then_the_reference(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` now raises ImportError
    monkeypatch.delitem(sys.modules, "nanovllm.kernels.cpu_paged_attention_numba")
    cpu_paged_attention._numba_kernel.cache_clear()
    try:
        b = build_batch(EMBEDDED_DECODE)
        with caplog.at_level(logging.WARNING, logger="nanovllm.kernels"):
            assert not cpu_fast_path_available()
            for _ in range(2):
                assert torch.equal(paged_attention_cpu(*b.args()), paged_attention_ref(*b.args()))
        notices = [r for r in caplog.records if "numba is not available" in r.getMessage()]
        assert len(notices) == 1
    finally:
        cpu_paged_attention._numba_kernel.cache_clear()  # the next caller finds numba again


def _args(**changes):
    b = build_batch(
        BatchSpec(
            (20, 7), (1, 7), block_size=4, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32
        )
    )
    args = dict(
        query=b.query,
        key_cache=b.key_cache,
        value_cache=b.value_cache,
        block_tables=b.block_tables,
        seq_lens=b.seq_lens,
        query_start_loc=b.query_start_loc,
        scale=b.scale,
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"block_tables": torch.tensor([[0, 1, 2, 99, 4], [5, 6, 7, 8, 9]], dtype=torch.int32)},
            "sequence 0: block table .* outside the cache's 9 blocks",
        ),
        (
            {"block_tables": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)},
            "sequence 0: seq_len=20 needs 5 blocks but block_tables has 2 columns",
        ),
        (
            {"seq_lens": torch.tensor([20, 6], dtype=torch.int32)},
            "sequence 1: seq_len=6 is shorter than its 7 query tokens",
        ),
        (
            {"query_start_loc": torch.tensor([0, 1, 9], dtype=torch.int32)},
            r"query_start_loc\[1:3\] = \[1, 9\] is not an ascending range inside the 8",
        ),
        ({"seq_lens": torch.tensor([20], dtype=torch.int32)}, "seq_lens must have shape"),
        ({"query": torch.zeros(8, 3, 16)}, "num_heads=3 is not a multiple of num_kv_heads=2"),
        ({"query": torch.zeros(8, 4, 16, dtype=torch.float64)}, "but the cache is torch.float32"),
    ],
)
def test_bad_arguments_raise_naming_the_value(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        paged_attention_cpu(**_args(**changes))


@settings(max_examples=examples(200), deadline=None)
@given(x=st.floats(min_value=-87.0, max_value=0.0, width=32))
def test_the_kernels_exp_is_within_five_ulp_of_exp(x: float) -> None:
    """`exp_nonpositive` (the kernel's vectorisable exp) against exp in float64, on every
    float32 the kernel gives it (a score minus the running max: <= 0; below -87 it clamps).
    (Measured on 20M random points: at most 4.5 ulp, near -87, where n ln 2 is largest.)"""
    import numpy as np

    from nanovllm.kernels.cpu_paged_attention_numba import exp_nonpositive

    got = float(exp_nonpositive(np.float32(x)))
    want = np.exp(np.float64(x))
    assert abs(got - want) <= 5 * np.spacing(np.float32(want)), (x, got, want)


def test_the_kernels_exp_clamps_below_minus_87_to_a_tiny_normal_weight() -> None:
    import numpy as np

    from nanovllm.kernels.cpu_paged_attention_numba import exp_nonpositive

    for x in (-87.5, -100.0, -1e30, -np.inf):
        got = float(exp_nonpositive(np.float32(x)))
        assert 0.0 < got <= 1.7e-38, (x, got)
