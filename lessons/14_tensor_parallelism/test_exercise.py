"""Lesson 14 properties: N ranks, simulated in one process, compute exactly what the uncut layer
computes.

Each property cuts a layer for every rank r of N with the implementation's functions, computes
each rank's part on its own (as N devices would, with nothing but their shard), combines the
parts, and compares with the layer computed whole. The linear-layer properties use small
integers stored as float64, so every product and sum is exact in any order: a difference is a
bug, never rounding. The MLP and attention properties compare in float64 with a 1e-9 tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from nanovllm.lessons.strategies import causal_attention_oracle, randn, seeds
from nanovllm.lessons.testing import lesson_settings, show_inputs

WORLD_SIZES = (1, 2, 3, 4, 8)


def _ints(seed: int, *shape: int) -> torch.Tensor:
    """A tensor of small integers (-4..4) in float64: sums of their products are exact."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=gen).double()


@dataclass(frozen=True)
class LinearCase:
    """A linear layer y = x W^T + b cut over `world_size` ranks: W [output_size, input_size],
    b [output_size] (or none), x [num_tokens, input_size]; `seed` makes their values."""

    world_size: int
    input_size: int
    output_size: int
    num_tokens: int
    bias: bool
    seed: int

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        w = _ints(self.seed, self.output_size, self.input_size)
        b = _ints(self.seed + 1, self.output_size) if self.bias else None
        x = _ints(self.seed + 2, self.num_tokens, self.input_size)
        return w, b, x


@st.composite
def linear_cases(draw, split: str) -> LinearCase:
    """Sizes that `world_size` divides where the layer is cut (`split`: "output" or "input")."""
    n = draw(st.sampled_from(WORLD_SIZES))
    per_rank = draw(st.integers(1, 5))
    other = draw(st.integers(1, 9))
    inp, out = (other, per_rank * n) if split == "output" else (per_rank * n, other)
    return LinearCase(n, inp, out, draw(st.integers(1, 4)), draw(st.booleans()), draw(seeds))


def _check_tiling(impl, fn: str, full: torch.Tensor, n: int, dim: int, name: str, what: str):
    """`fn`'s shards of `full` for ranks 0..n-1: each holds 1/n of dimension `dim` (`what`), and
    concatenated along it in rank order they are `full` again; `full` is left as it was."""
    before = full.clone()
    shards = [getattr(impl, fn)(full, r, n) for r in range(n)]
    assert torch.equal(full, before), f"{fn} modified the weight it was given"
    want = tuple(size // n if d == dim else size for d, size in enumerate(full.shape))
    for r, shard in enumerate(shards):
        assert tuple(shard.shape) == want, (
            f"rank {r} of {n}: {fn} of {name} {tuple(full.shape)} has shape "
            f"{tuple(shard.shape)}, not {want}: a rank holds 1/{n} of the {what}"
        )
    assert torch.equal(torch.cat(shards, dim=dim), full), (
        f"the {n} ranks' {fn} pieces of {name}, put together in rank order, are not {name}: "
        f"rank r holds the r-th block of consecutive {what}"
    )


# --- the shards ---------------------------------------------------------------------------------


@lesson_settings(40)
@given(case=linear_cases("output"))
@show_inputs
def test_column_shards_tile_the_weight(impl, case):
    """Rank r's column shard is rows [r * n, (r + 1) * n) of W (and entries of b): shards of
    shape [n, input_size] that, stacked in rank order, give W back."""
    w, b, _ = case.tensors()
    _check_tiling(impl, "column_shard", w, case.world_size, 0, "W", "output rows")
    if b is not None:
        _check_tiling(impl, "column_shard", b, case.world_size, 0, "b", "output rows")


@lesson_settings(40)
@given(case=linear_cases("input"))
@show_inputs
def test_row_shards_tile_the_weight(impl, case):
    """Rank r's row shard is columns [r * n, (r + 1) * n) of W: shards of shape
    [output_size, n] that, side by side in rank order, give W back."""
    w, _, _ = case.tensors()
    _check_tiling(impl, "row_shard", w, case.world_size, 1, "W", "input columns")


# --- the layers -----------------------------------------------------------------------------------


@lesson_settings(40)
@given(case=linear_cases("output"))
@show_inputs
def test_column_parallel_linear_equals_the_whole_layer(impl, case):
    """Every rank multiplies the whole input by its shard (its output features, its bias
    entries); gathering the ranks' outputs gives exactly x W^T + b."""
    w, b, x = case.tensors()
    n = case.world_size
    outputs = []
    for r in range(n):
        w_r = impl.column_shard(w, r, n)
        b_r = impl.column_shard(b, r, n) if b is not None else None
        outputs.append(F.linear(x, w_r, b_r))  # [num_tokens, output_size / n]
    copies = [o.clone() for o in outputs]
    y = impl.gather_columns(outputs)
    want = F.linear(x, w, b)
    assert all(torch.equal(o, c) for o, c in zip(outputs, copies)), (
        "gather_columns modified the outputs"
    )
    assert tuple(y.shape) == tuple(want.shape), (
        f"gather_columns of {n} outputs {tuple(outputs[0].shape)} gave {tuple(y.shape)}, "
        f"not {tuple(want.shape)}: output features side by side"
    )
    assert torch.equal(y, want), (
        f"the {n} ranks' outputs, gathered, are not x W^T + b "
        f"(first difference at {_first_difference(y, want)})"
    )


@lesson_settings(40)
@given(case=linear_cases("input"))
@show_inputs
def test_row_parallel_linear_equals_the_whole_layer(impl, case):
    """Every rank multiplies its slice of the input features by its shard, a partial result
    of the whole output's shape; reducing the partials (the bias added once) gives exactly
    x W^T + b."""
    w, b, x = case.tensors()
    n, per_rank = case.world_size, case.input_size // case.world_size
    partials = []
    for r in range(n):
        x_r = x[:, r * per_rank : (r + 1) * per_rank]  # what rank r receives
        partials.append(F.linear(x_r, impl.row_shard(w, r, n)))  # [num_tokens, output_size]
    copies = [p.clone() for p in partials]
    y = impl.reduce_rows(partials, b)
    want = F.linear(x, w, b)
    assert all(torch.equal(p, c) for p, c in zip(partials, copies)), (
        "reduce_rows modified the partials"
    )
    assert tuple(y.shape) == tuple(want.shape), (
        f"reduce_rows of {n} partials {tuple(partials[0].shape)} gave {tuple(y.shape)}, not "
        f"{tuple(want.shape)}: the partials are summed, element by element"
    )
    if torch.equal(y, want):
        return
    if b is not None and n > 1 and torch.equal(y, want + (n - 1) * b):
        raise AssertionError(f"the bias was added {n} times, once per rank: add it once")
    if b is not None and torch.equal(y, want - b):
        raise AssertionError("the bias is missing: add it once, to the sum")
    raise AssertionError(
        f"the {n} ranks' partials, reduced, are not x W^T + b "
        f"(first difference at {_first_difference(y, want)})"
    )


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    index = tuple(int(i) for i in (a != b).nonzero()[0])
    return f"{list(index)}: {float(a[index]):g} instead of {float(b[index]):g}"


@dataclass(frozen=True)
class MLPCase:
    """A SwiGLU MLP, down(silu(gate(x)) * up(x)), hidden -> intermediate -> hidden, over
    `world_size` ranks."""

    world_size: int
    hidden_size: int
    intermediate_size: int
    num_tokens: int
    seed: int


@st.composite
def mlp_cases(draw) -> MLPCase:
    n = draw(st.sampled_from(WORLD_SIZES))
    return MLPCase(
        n,
        draw(st.integers(1, 8)),
        n * draw(st.integers(1, 4)),
        draw(st.integers(1, 4)),
        draw(seeds),
    )


@lesson_settings(30)
@given(case=mlp_cases())
@show_inputs
def test_mlp_needs_one_reduction(impl, case):
    """Megatron's pairing: gate and up column-parallel, down row-parallel. Each rank runs its
    slice of the intermediate features from end to end with no communication in between (its
    gate and up outputs are exactly the inputs its down shard needs); one reduction at the end
    gives the whole MLP's output."""
    n, h, i, t = case.world_size, case.hidden_size, case.intermediate_size, case.num_tokens
    s = case.seed
    gate = randn(s, i, h, dtype=torch.float64)
    up = randn(s + 1, i, h, dtype=torch.float64)
    down = randn(s + 2, h, i, dtype=torch.float64)
    x = randn(s + 3, t, h, dtype=torch.float64)
    partials = []
    for r in range(n):
        g_r = F.linear(x, impl.column_shard(gate, r, n))  # [t, i / n]
        u_r = F.linear(x, impl.column_shard(up, r, n))
        partials.append(F.linear(F.silu(g_r) * u_r, impl.row_shard(down, r, n)))  # [t, h]
    y = impl.reduce_rows(partials, None)
    want = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)
    assert tuple(y.shape) == (t, h), f"the MLP's output has shape {tuple(y.shape)}, not {(t, h)}"
    assert torch.allclose(y, want, rtol=1e-9, atol=1e-9), (
        f"{n} ranks' MLP differs from the whole MLP by up to {float((y - want).abs().max()):.3g}"
    )


# --- attention heads ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadsCase:
    world_size: int
    num_heads: int
    num_kv_heads: int


@st.composite
def head_cases(draw) -> HeadsCase:
    """num_heads = num_kv_heads * group; a world size that divides num_heads and that
    num_kv_heads divides or is divided by; often one larger than num_kv_heads (replicas)."""
    kv = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    heads = kv * draw(st.integers(1, 4))
    sizes = [n for n in range(1, heads + 1) if heads % n == 0 and (kv % n == 0 or n % kv == 0)]
    more = [n for n in sizes if n > kv]
    pool = more if more and draw(st.booleans()) else sizes
    return HeadsCase(draw(st.sampled_from(pool)), heads, kv)


def _heads(impl, case: HeadsCase, rank: int) -> tuple[list[int], list[int]]:
    q, kv = impl.heads_of_rank(rank, case.world_size, case.num_heads, case.num_kv_heads)
    return [int(h) for h in q], [int(h) for h in kv]


@lesson_settings(40)
@given(case=head_cases())
@show_inputs
def test_each_rank_holds_its_heads_and_the_kv_heads_they_read(impl, case):
    """The query heads are dealt out in order, num_heads / N to each rank; a rank holds
    max(1, num_kv_heads / N) KV heads, exactly those its query heads read; with more ranks
    than KV heads each KV head is copied on N / num_kv_heads ranks."""
    n, h, kv = case.world_size, case.num_heads, case.num_kv_heads
    group = h // kv
    copies = [0] * kv
    for r in range(n):
        q_heads, kv_heads = _heads(impl, case, r)
        assert q_heads == list(range(r * h // n, (r + 1) * h // n)), (
            f"rank {r} of {n}: query heads {q_heads}; with {h} heads each rank runs {h // n}, "
            "the next ones in order"
        )
        read = sorted({q // group for q in q_heads})
        assert kv_heads == read, (
            f"rank {r} of {n}: KV heads {kv_heads}, but its query heads {q_heads} read KV heads "
            f"{read} (query head q reads KV head q // {group}): hold exactly those"
        )
        for k in kv_heads:
            copies[k] += 1
    assert copies == [max(1, n // kv)] * kv, f"copies of each KV head over the {n} ranks: {copies}"


@lesson_settings(30)
@given(case=head_cases(), head_dim=st.integers(1, 4), num_tokens=st.integers(1, 5), seed=seeds)
@show_inputs
def test_attention_cut_by_heads_equals_the_whole(impl, case, head_dim, num_tokens, seed):
    """Each rank projects the tokens to its own query and KV heads (the rows of Wq, Wk and Wv
    of those heads) and runs causal attention on them alone, its local query head i reading
    its local KV head i // (its query heads / its KV heads); the ranks' heads, side by side in
    rank order, are the whole attention's output."""
    n, h, kv, d = case.world_size, case.num_heads, case.num_kv_heads, head_dim
    hidden = 6
    wq = randn(seed, h * d, hidden, dtype=torch.float64)
    wk = randn(seed + 1, kv * d, hidden, dtype=torch.float64)
    wv = randn(seed + 2, kv * d, hidden, dtype=torch.float64)
    x = randn(seed + 3, num_tokens, hidden, dtype=torch.float64)
    scale = d**-0.5

    def project(w: torch.Tensor, heads: list[int]) -> torch.Tensor:
        rows = torch.cat([w[i * d : (i + 1) * d] for i in heads]) if heads else w[:0]
        return F.linear(x, rows).view(num_tokens, len(heads), d)

    all_kv_heads = list(range(kv))
    whole = causal_attention_oracle(
        project(wq, list(range(h))), project(wk, all_kv_heads), project(wv, all_kv_heads), scale
    )  # [num_tokens, h, d]
    outs = []
    for r in range(n):
        q_heads, kv_heads = _heads(impl, case, r)
        assert q_heads and kv_heads and len(q_heads) % len(kv_heads) == 0, (
            f"rank {r} of {n}: {len(q_heads)} query heads and {len(kv_heads)} KV heads: each "
            "local KV head must serve the same number of local query heads"
        )
        outs.append(
            causal_attention_oracle(
                project(wq, q_heads), project(wk, kv_heads), project(wv, kv_heads), scale
            )
        )
    got = torch.cat(outs, dim=1)
    assert tuple(got.shape) == tuple(whole.shape), (
        f"the ranks' heads together: {got.shape[1]} heads, not {h}"
    )
    worst = (got - whole).abs().amax(dim=(0, 2))  # per head
    bad = [i for i, e in enumerate(worst.tolist()) if e > 1e-9]
    assert not bad, (
        f"heads {bad} (in rank order) differ from the whole attention's, by up to "
        f"{float(worst.max()):.3g}"
    )
