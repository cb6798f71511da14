"""Each tensor-parallel layer's sharded computation equals the unsharded one, at tp 1 and 2.

One group of 2 gloo ranks (this process is rank 0, one spawned worker is rank 1) serves the
whole module. Hypothesis draws the shapes here, in rank 0; `run_all` sends each example to both
ranks, where `rank_checks.RankChecks` builds the full weights from a seed, shards them through
the layers' weight loaders and compares with plain torch. The same checks run at tp 1 in this
process with no process group (where the layers must be plain, communication-free layers).
"""

from __future__ import annotations

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_checks import RankChecks, write_checkpoint

from nanovllm.distributed import WorkerGroup, as_tp_rank, get_tp_world_size
from nanovllm.models.embedding import VocabParallelEmbedding
from nanovllm.models.linear import QKVParallelLinear

TOL = 1e-4
EXAMPLES = settings(max_examples=examples(12), deadline=None)


@pytest.fixture(scope="module")
def tp2():
    with WorkerGroup(2, RankChecks, timeout_s=60) as group:
        yield group
    assert get_tp_world_size() == 1  # closing left the process group


@pytest.fixture(scope="module")
def tp1() -> RankChecks:
    with as_tp_rank(0, 1):
        return RankChecks(0)


def on_every_rank(tp2, tp1, method: str, *args):
    """The method's result on rank 0 and 1 of the tp-2 group, and alone at tp 1."""
    with as_tp_rank(0, 1):
        alone = getattr(tp1, method)(*args)
    return [*tp2.run_all(method, *args), alone]


seeds = st.integers(0, 10_000)
tokens = st.integers(1, 9)
even = st.integers(1, 12).map(lambda k: 2 * k)  # a size tp 2 can split


def test_ranks_know_their_place(tp2):
    (r0, w0, pid0), (r1, w1, pid1) = tp2.run_all("whoami")
    assert (r0, w0, r1, w1) == (0, 2, 1, 2)
    assert pid0 != pid1 and tp2.pids == {1: pid1}


@EXAMPLES
@given(
    seed=seeds,
    n=tokens,
    d_in=st.integers(1, 24),
    d_out=even,
    bias=st.booleans(),
    gather=st.booleans(),
)
def test_column_parallel_linear(tp2, tp1, seed, n, d_in, d_out, bias, gather):
    assert max(on_every_rank(tp2, tp1, "column", seed, n, d_in, d_out, bias, gather)) < TOL


@EXAMPLES
@given(
    seed=seeds,
    n=tokens,
    d_in=even,
    d_out=st.integers(1, 24),
    bias=st.booleans(),
    parallel_in=st.booleans(),
)
def test_row_parallel_linear_adds_bias_once(tp2, tp1, seed, n, d_in, d_out, bias, parallel_in):
    assert max(on_every_rank(tp2, tp1, "row", seed, n, d_in, d_out, bias, parallel_in)) < TOL


@EXAMPLES
@given(seed=seeds, n=tokens, hidden=st.integers(1, 24), inter=even, fused=st.booleans())
def test_merged_gate_up_with_row_parallel_down(tp2, tp1, seed, n, hidden, inter, fused):
    assert max(on_every_rank(tp2, tp1, "mlp", seed, n, hidden, inter, fused)) < TOL


@EXAMPLES
@given(
    seed=seeds,
    n=tokens,
    hidden=st.integers(4, 24),
    kv_heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 3]),
    head_size=st.sampled_from([2, 4, 8]),
    bias=st.booleans(),
)
def test_qkv_column_parallel_by_heads_then_o_proj(
    tp2, tp1, seed, n, hidden, kv_heads, group, head_size, bias
):
    """Fused q/k/v split by heads + row-parallel o_proj = the whole attention block.

    kv_heads=1 is fewer KV heads than ranks: each rank must hold a copy of the one KV head.
    """
    heads = kv_heads * group
    if heads % 2:
        heads *= 2  # tp 2 must divide the query heads
    results = on_every_rank(
        tp2, tp1, "attention", seed, n, hidden, heads, kv_heads, head_size, bias
    )
    assert max(r["diff"] for r in results) < TOL
    rank0, rank1, alone = results
    assert alone["num_kv_heads"] == kv_heads and alone["replicas"] == 1
    if kv_heads == 1:
        assert rank0["num_kv_heads"] == rank1["num_kv_heads"] == 1
        assert rank0["replicas"] == rank1["replicas"] == 2
    else:
        assert rank0["num_kv_heads"] == kv_heads // 2 and rank0["replicas"] == 1


def test_kv_heads_replicated_when_fewer_than_ranks():
    """A 4-rank layout (no processes needed to check shapes): 8 q heads, 2 kv heads."""
    layouts = []
    for rank in range(4):
        with as_tp_rank(rank, 4):
            layer = QKVParallelLinear(16, 4, total_num_heads=8, total_num_kv_heads=2)
            k = torch.arange(2 * 4, dtype=torch.float32).repeat_interleave(16).view(8, 16)
            q = torch.zeros(8 * 4, 16)
            for shard, w in (("q", q), ("k", k), ("v", k)):
                layer.weight.weight_loader(layer.weight, w, shard)
            kv_rows = layer.weight[layer.q_size : layer.q_size + layer.kv_size, 0]
            layouts.append((layer.num_kv_heads, layer.num_kv_head_replicas, kv_rows.tolist()))
    # Ranks 0, 1 serve query heads 0-3 (KV head 0, rows 0-3); ranks 2, 3 KV head 1 (rows 4-7).
    assert layouts == [(1, 2, [0, 1, 2, 3])] * 2 + [(1, 2, [4, 5, 6, 7])] * 2


@EXAMPLES
@given(seed=seeds, n=tokens, vocab=st.integers(1, 40), dim=st.integers(1, 8))
def test_vocab_parallel_embedding(tp2, tp1, seed, n, vocab, dim):
    rank0, rank1, alone = on_every_rank(tp2, tp1, "embedding", seed, n, vocab, dim)
    assert max(r["diff"] for r in (rank0, rank1, alone)) < TOL
    assert rank0["padded"] == vocab + vocab % 2  # padded to a multiple of tp 2
    assert rank0["rows"] == rank1["rows"] == rank0["padded"] // 2
    assert alone["padded"] == alone["rows"] == vocab


@EXAMPLES
@given(seed=seeds, n=tokens, vocab=st.integers(1, 40), dim=st.integers(1, 8), tied=st.booleans())
def test_parallel_lm_head_gathers_and_trims(tp2, tp1, seed, n, vocab, dim, tied):
    assert max(on_every_rank(tp2, tp1, "lm_head", seed, n, vocab, dim, tied)) < TOL


@settings(max_examples=examples(5), deadline=None)
@given(seed=seeds)
def test_collectives_and_broadcasts(tp2, tp1, seed):
    for result in on_every_rank(tp2, tp1, "collectives", seed):
        assert result == {"reduce": 0.0, "gather": 0.0, "object": True, "inputs": True}


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_load_sharded_reads_each_rank_its_slice(tp2, tp1, tmp_path, kv_heads):
    """From a Hugging Face-named safetensors file, each rank reads exactly what it holds.

    kv_heads=1 < tp: both ranks read (and hold) the one KV head. The block computed from the
    loaded shards equals the same block computed with the full tensors.
    """
    args = dict(vocab=14, hidden=16, heads=4, kv_heads=kv_heads, head_size=4, inter=24)
    path = tmp_path / "model.safetensors"
    write_checkpoint(path, **args)
    rank0, rank1, alone = on_every_rank(tp2, tp1, "load", str(path), args)
    for result in (rank0, rank1, alone):
        assert result["diff"] < TOL
        assert result["bytes_read"] == result["bytes_held"]  # nothing read beyond the slice
    assert alone["bytes_read"] < alone["bytes_in_file"]  # RoPE table skipped
    # The two ranks together read the checkpoint once, plus what both must hold whole: the norm,
    # o_proj's bias and, with one KV head, k and v (weights and biases).
    replicated = 16 + 16 + (2 * (4 * 16 + 4) if kv_heads == 1 else 0)
    assert rank0["bytes_read"] + rank1["bytes_read"] == alone["bytes_read"] + 4 * replicated


@as_tp_rank(0, 1)
def test_layers_at_tp1_are_plain_modules():
    """At tp 1 no process group exists and a layer is exactly its unsharded computation."""
    assert get_tp_world_size() == 1
    embed = VocabParallelEmbedding(10, 4)
    assert embed.weight.shape == (10, 4)
    qkv = QKVParallelLinear(8, 2, total_num_heads=4, total_num_kv_heads=2)
    assert qkv.weight.shape == ((4 + 2 * 2) * 2, 8)
