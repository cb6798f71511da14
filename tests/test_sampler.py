"""The sampler: vLLM's filter semantics, its two draws (the exponential race, hashed
Gumbel-max), per-request generators on the logits' device, tiny temperatures, and rows that
cannot be sampled failing alone.

Oracles: the filters' definitions written out one token at a time in float64 (independent of
the batched tensor code), a chi-square test of the draws against the distribution they come
from, tokens vLLM's own CPU kernel drew (recorded), and the engine's greedy output.
"""

from __future__ import annotations

import math

import pytest
import torch
from budget import examples
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from nanovllm import LLM, SamplingParams
from nanovllm.backends.sampler import FastSampler, fast_greedy_tokens
from nanovllm.executor.random_draw import draw_for, exponential_race, hashed_gumbel_max
from nanovllm.executor.sampler import Sampler, apply_filters, greedy_tokens
from nanovllm.request import Request

MARGIN = 1e-6  # decisions this close to their threshold may go either way in float32


def reference_kept(logits: list[float], top_k: int, top_p: float, min_p: float) -> set[int] | None:
    """vLLM's rules, one token at a time in float64. None when a decision is too close to call."""
    n = len(logits)
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    probs = [w / total for w in weights]
    # 1. min-p on the full distribution.
    threshold = min_p * max(probs)
    if any(abs(p - threshold) < MARGIN for p in probs) and min_p > 0:
        return None
    alive = [i for i in range(n) if probs[i] >= threshold]
    # 2. top-k: logits at least the k-th largest (of the survivors; ties kept).
    k = min(top_k, n)
    ranked = sorted((logits[i] for i in alive), reverse=True)
    if k <= len(ranked):
        alive = [i for i in alive if logits[i] >= ranked[k - 1]]
    # 3. top-p on the renormalised survivors, most likely first.
    if top_p >= 1:
        return set(alive)
    order = sorted(alive, key=lambda i: -logits[i])
    mass = sum(probs[i] for i in order)
    kept, above = set(), 0.0
    for i in order:
        if abs(above - top_p) < MARGIN:
            return None
        if above >= top_p:
            break
        kept.add(i)
        above += probs[i] / mass
    return kept


@pytest.mark.quick
@settings(max_examples=examples(80), deadline=None)
# min-p drops the two 0.1 tokens; renormalised, the top token alone reaches top_p = 0.6.
@example(logits=[math.log(p) for p in (0.5, 0.3, 0.1, 0.1 + 1e-3)], top_k=4, top_p=0.6, min_p=0.3)
@given(
    logits=st.lists(st.floats(-5, 5, width=32), min_size=8, max_size=8, unique=True),
    top_k=st.integers(1, 8),
    top_p=st.floats(0.05, 1.0),
    min_p=st.floats(0.0, 1.0),
)
def test_filters_keep_exactly_what_vllm_keeps(logits, top_k, top_p, min_p) -> None:
    expected = reference_kept(logits, top_k, top_p, min_p)
    assume(expected is not None)
    out = apply_filters(
        torch.tensor([logits]), torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([min_p])
    )
    kept = set(torch.nonzero(out[0] > float("-inf")).flatten().tolist())
    assert kept == expected
    assert torch.equal(out[0][list(kept)], torch.tensor(logits)[list(kept)]), "kept logits changed"


@settings(max_examples=examples(50), deadline=None)
@given(
    logits=st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=10),
    top_k=st.integers(1, 12),
)
def test_top_k_keeps_every_token_tied_with_the_kth(logits, top_k) -> None:
    """vLLM keeps ties: with logits [3, 2, 2, 1] and k=2, three tokens stay."""
    out = apply_filters(
        torch.tensor([logits]),
        torch.tensor([min(top_k, len(logits))]),
        torch.ones(1),
        torch.zeros(1),
    )
    kept = {i for i, x in enumerate(out[0].tolist()) if x > float("-inf")}
    kth = sorted(logits, reverse=True)[min(top_k, len(logits)) - 1]
    assert kept == {i for i, x in enumerate(logits) if x >= kth}


def _request(i: int, params: SamplingParams, seed: int | None = None) -> Request:
    return Request(f"r{i}", [0], params, i, seed=seed if seed is not None else i)


DRAWS = [exponential_race, hashed_gumbel_max]


@pytest.mark.parametrize("draw", DRAWS, ids=lambda d: d.__name__)
def test_draws_follow_the_distribution(draw) -> None:
    """Chi-square: 4000 rows, each with its own seed, drawn from the same 5-token distribution."""
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    n = 4000
    logits = probs.log().expand(n, -1).contiguous()
    requests = [_request(i, SamplingParams(temperature=1.0)) for i in range(n)]
    tokens = [t for (t,) in Sampler(draw=draw)(logits, requests).token_ids]
    counts = torch.bincount(torch.tensor(tokens), minlength=5).double()
    expected = probs.double() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5, f"chi2={chi2:.1f} (4 dof; p < 0.001 beyond 18.5): counts {counts.tolist()}"


@pytest.mark.parametrize("draw", DRAWS, ids=lambda d: d.__name__)
def test_a_seeded_row_draws_the_same_whatever_shares_the_batch(draw) -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    for step in range(5):  # a request's generator advances by its own draws only
        alone = Sampler(draw=draw)(logits[2:3], [_request(2, params, seed=77)]).token_ids[0]
        assert len(alone) == 1
        batch = [_request(i, params, seed=77 if i == 2 else 1000 + i) for i in range(6)]
        assert Sampler(draw=draw)(logits, batch).token_ids[2] == alone, f"step {step}"
        logits = logits.roll(step + 1, dims=1)


# Tokens vLLM 0.32's CPU kernel (`torch.ops._C.fused_gumbel_argmax`, which
# `TopKTopPSampler.forward_cpu` calls) gave for these logits and per-step seeds. Row 5 keeps its
# first 100 tokens only; row 9 is all -inf (token 0, like argmax).
VLLM_CPU_SEEDS = [(k * 2654435761) % 2**31 for k in range(32)]
VLLM_CPU_TOKENS = [
    490, 184, 740, 623, 898, 52, 206, 249, 668, 0, 339, 517, 690, 521, 646, 979,
    389, 929, 451, 608, 841, 169, 129, 902, 123, 253, 978, 397, 334, 807, 627, 502,
]  # fmt: skip
# What a generator seeded with 1234 gives `forward_cpu` as the per-step seeds of its first 3 steps.
VLLM_CPU_STEP_SEEDS_1234 = [2137449171, 1365105717, 481516916]


class _Seeds:
    """Stands in for a generator: `torch.randint(..., generator=g)` is patched to read these."""

    def __init__(self, seed: int) -> None:
        self.seed = seed


def test_hashed_gumbel_max_draws_what_vllms_cpu_kernel_draws(monkeypatch) -> None:
    r = torch.arange(32, dtype=torch.float64)[:, None]
    i = torch.arange(1000, dtype=torch.float64)[None, :]
    logits = (torch.sin(r * 7.0 + i * 1.3) * 3.0).float()  # [32, 1000]
    logits[5, 100:] = float("-inf")
    logits[9] = float("-inf")
    real = torch.randint

    def randint(*args, generator=None, **kwargs):
        if isinstance(generator, _Seeds):
            return torch.tensor([generator.seed])
        return real(*args, generator=generator, **kwargs)

    monkeypatch.setattr(torch, "randint", randint)
    tokens = hashed_gumbel_max(logits, logits.softmax(-1), [_Seeds(s) for s in VLLM_CPU_SEEDS])
    assert tokens == VLLM_CPU_TOKENS


def test_hashed_gumbel_max_takes_one_seed_a_step_from_the_generator_as_vllm_does() -> None:
    generator = torch.Generator().manual_seed(1234)
    seen = [int(torch.randint(0, 2**31, (1,), generator=generator)) for _ in range(3)]
    assert seen == VLLM_CPU_STEP_SEEDS_1234
    # ... and the draw consumes exactly that: after one draw the generator gives the 2nd seed.
    generator = torch.Generator().manual_seed(1234)
    hashed_gumbel_max(torch.zeros(1, 8), torch.full((1, 8), 1 / 8), [generator])
    assert int(torch.randint(0, 2**31, (1,), generator=generator)) == VLLM_CPU_STEP_SEEDS_1234[1]


def test_each_device_gets_the_draw_vllm_uses_there() -> None:
    assert draw_for(torch.device("cpu")) is hashed_gumbel_max
    assert draw_for(torch.device("cuda")) is exponential_race


def test_generators_are_made_on_the_logits_device(monkeypatch) -> None:
    """A CPU generator cannot drive random ops on CUDA tensors: each draw must use a generator
    on the device of the tensor it fills (here the CPU; the gpu tests run the CUDA case)."""
    seen = []
    real = torch.Tensor.exponential_

    def spy(self, *args, generator=None, **kwargs):
        seen.append((self.device, generator.device if generator is not None else None))
        return real(self, *args, generator=generator, **kwargs)

    monkeypatch.setattr(torch.Tensor, "exponential_", spy)
    requests = [_request(i, SamplingParams(temperature=1.0)) for i in range(3)]
    Sampler(draw=exponential_race)(torch.randn(3, 10), requests)
    assert len(seen) == 3
    assert all(tensor_device == gen_device for tensor_device, gen_device in seen)
    assert all(
        r.generator is not None and r.generator.device == torch.device("cpu") for r in requests
    )


# Logits with ties, NaN and infinities: the cases where an argmax can go wrong.
special_logits = st.lists(
    st.lists(
        st.sampled_from([0.0, 1.0, 1.0, -2.5, math.inf, -math.inf, math.nan]) | st.floats(-5, 5),
        min_size=1,
        max_size=12,
    ),
    min_size=1,
    max_size=6,
).filter(lambda rows: len({len(r) for r in rows}) == 1)


@pytest.mark.parametrize("tokens", [greedy_tokens, fast_greedy_tokens])
@settings(deadline=None)
@given(rows=special_logits)
def test_greedy_tokens_equal_torch_max(tokens, rows) -> None:
    """The plain path and the numpy fast path (`backends/sampler.py`) against torch's `max`: the
    first index of a tied maximum; a row with a NaN, or with every token at -inf, has no token
    to give."""
    logits = torch.tensor(rows, dtype=torch.float32)
    argmax, bad = tokens(logits)
    best, want = logits.max(dim=-1)
    assert bad.tolist() == (torch.isnan(best) | torch.isneginf(best)).tolist()
    # A bad row has no token to compare (the sampler reports it); every other row must agree.
    assert [a for a, b in zip(argmax, bad.tolist()) if not b] == [
        w for w, b in zip(want.tolist(), bad.tolist()) if not b
    ]


@pytest.mark.parametrize("sampler_class", [Sampler, FastSampler])
@settings(deadline=None)
@given(
    rows=st.lists(st.integers(0, 2), min_size=1, max_size=6),  # 0 plain, 1 NaN, 2 logprobs
    seed=st.integers(0, 2**16),
)
@example(rows=[0, 0, 0], seed=0)  # the plain greedy step
@example(rows=[0, 1, 0], seed=0)  # one bad row among plain ones
def test_a_greedy_batch_gives_each_rows_argmax(sampler_class, rows: list[int], seed: int) -> None:
    """All-greedy batches (the fast sampler's shortcut when nothing else is asked, and the
    plain sampler): each row's argmax, a NaN row reported alone, logprobs exactly for the
    requests that asked."""
    logits = torch.randn(len(rows), 30, generator=torch.Generator().manual_seed(seed))
    requests = []
    for i, kind in enumerate(rows):
        if kind == 1:
            logits[i, i] = float("nan")
        requests.append(
            _request(i, SamplingParams(temperature=0, logprobs=1 if kind == 2 else None))
        )
    out = sampler_class()(logits, requests, [[] for _ in requests])
    assert set(out.errors) == {i for i, kind in enumerate(rows) if kind == 1}
    for i, kind in enumerate(rows):
        if kind != 1:
            assert out.token_ids[i] == [int(logits[i].argmax())]
        assert (out.logprobs[i] is not None) == (kind == 2)


def test_tiny_temperatures_are_greedy() -> None:
    for t in (1e-6, 1e-7, 1e-40, 0.0):
        assert SamplingParams(temperature=t).greedy
    assert not SamplingParams(temperature=1e-5).greedy


def test_a_nan_row_fails_alone() -> None:
    logits = torch.randn(4, 20)
    logits[1, 3] = float("nan")
    requests = [
        _request(0, SamplingParams(temperature=0)),
        _request(1, SamplingParams(temperature=0.7)),
        _request(2, SamplingParams(temperature=0.7)),
        _request(3, SamplingParams(temperature=0, logprobs=2)),
    ]
    out = Sampler()(logits, requests)
    assert set(out.errors) == {1} and "'r1'" in out.errors[1] and "temperature=0.7" in out.errors[1]
    assert out.token_ids[0] == [int(logits[0].argmax())]
    assert out.token_ids[3] == [int(logits[3].argmax())]
    assert out.token_ids[1] == [] and 0 <= out.token_ids[2][0] < 20
    assert out.logprobs[3] is not None


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), block_size=4)


def test_tiny_temperatures_do_not_break_the_batch(llm: LLM) -> None:
    greedy = llm.generate(["ROMEO:"], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    prompts = ["ROMEO:", "JULIET:", "ROMEO:"]
    params = [
        SamplingParams(temperature=1e-7, max_tokens=8),
        SamplingParams(temperature=0.8, seed=3, max_tokens=8),
        SamplingParams(temperature=1e-40, max_tokens=8),
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids
    assert outs[2].outputs[0].token_ids == greedy[0].outputs[0].token_ids
    assert all(o.outputs[0].finish_reason in ("stop", "length") for o in outs)


def test_a_request_whose_logits_are_nan_finishes_alone_with_an_error(llm: LLM) -> None:
    engine = llm.llm_engine
    clean = llm.generate(["JULIET:"], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    model = engine.runner.model
    real = model.compute_logits
    victim = {"row": None}

    def poisoned(hidden):
        logits = real(hidden)
        if victim["row"] is not None:
            logits[victim["row"]] = float("nan")
        return logits

    engine.add_request("bad", "ROMEO:", SamplingParams(temperature=0.5, max_tokens=6))
    engine.add_request("good", "JULIET:", SamplingParams(temperature=0, max_tokens=6))
    model.compute_logits = poisoned
    try:
        victim["row"] = 0  # "bad" was added first: it is row 0 of the first sampling step
        outputs = engine.step()
        victim["row"] = None
        final = {o.request_id: o for o in outputs if o.finished}
        final.update(engine.run_until_done())
    finally:
        model.compute_logits = real
    bad, good = final["bad"], final["good"]
    assert bad.outputs[0].finish_reason == "error" and bad.outputs[0].token_ids == []
    assert "'bad'" in bad.error and "no next token can be drawn" in bad.error
    assert good.outputs[0].token_ids == clean[0].outputs[0].token_ids
    assert engine.kv_cache_manager.num_used_blocks == 0
