"""The attention probe against the reference attention: what the executor panel's heat row shows.

Two oracles, both independent of the engine's attention code:
- the online softmax walk (`online_softmax.py`) against torch's softmax over q·k^T × scale on a
  contiguous layout (GQA included), every block size from 1 to 16;
- the probe on a real engine (a tiny random Llama), through chunked prefill and prefix-cache hits,
  against transformers' eager attention weights (`output_attentions=True`) over the request's
  whole token sequence: the row of its newest query in each probed step. Its running max and
  sum after each block are checked against the max and the sum over the scores up to that block,
  computed directly.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanovllm.events import AttentionProbed, event_from_dict, event_to_dict
from nanovllm.executor.online_softmax import online_softmax_walk

# Tiny tensors: torch single-threaded (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@settings(max_examples=examples(15), deadline=None)
@given(
    block_size=st.integers(1, 16),
    seq_len=st.integers(1, 40),
    heads=st.sampled_from([(4, 4), (4, 2), (6, 2), (2, 1)]),
    spread=st.sampled_from([0.1, 1.0, 10.0]),  # from flat to peaked weights
    seed=st.integers(0, 2**16),
)
def test_online_softmax_walk_equals_the_softmax(block_size, seq_len, heads, spread, seed):
    num_heads, num_kv_heads = heads
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_heads, 8, generator=g) * spread
    keys = torch.randn(seq_len, num_kv_heads, 8, generator=g)
    walk = online_softmax_walk(q, keys, block_size, 8**-0.5)
    # The oracle: contiguous attention, each query head over its KV head's keys.
    group = num_heads // num_kv_heads
    k = keys[:, torch.arange(num_heads) // group]  # [seq_len, num_heads, 8]
    scores = (q[None] * k).sum(-1).T * 8**-0.5  # [num_heads, seq_len]
    torch.testing.assert_close(walk.scores, scores, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(walk.weights, scores.softmax(-1), rtol=1e-5, atol=1e-6)
    ends = list(range(block_size, seq_len, block_size)) + [seq_len]
    assert walk.running_max.shape == walk.running_sum.shape == (num_heads, len(ends))
    for b, end in enumerate(ends):  # after block b: max and sum over every score so far
        m = scores[:, :end].max(-1).values
        torch.testing.assert_close(walk.running_max[:, b], m)
        torch.testing.assert_close(
            walk.running_sum[:, b], (scores[:, :end] - m[:, None]).exp().sum(-1), rtol=1e-5, atol=0
        )


def test_online_softmax_walk_refuses_bad_input():
    q, keys = torch.zeros(4, 8), torch.zeros(3, 2, 8)
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        online_softmax_walk(q, keys, 0, 1.0)
    with pytest.raises(ValueError, match="3 query heads do not group over 2 KV heads"):
        online_softmax_walk(torch.zeros(3, 8), keys, 4, 1.0)
    with pytest.raises(ValueError, match="the context is empty"):
        online_softmax_walk(q, keys[:0], 4, 1.0)


# --- on a real engine ------------------------------------------------------------------------------


@functools.cache
def hf_model(model_path: Path):
    """transformers' model with its eager attention, which can return the weights."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation="eager"
    )


def hf_attentions(model_path: Path, token_ids: list[int]) -> tuple[torch.Tensor, ...]:
    """transformers' eager attention weights of every layer, [1, heads, n, n] each."""
    with torch.no_grad():
        return hf_model(model_path)(torch.tensor([token_ids]), output_attentions=True).attentions


def check_probe(event: AttentionProbed, reference: torch.Tensor, block_size: int) -> None:
    """The event against the reference weights of its layer ([heads, n, n]) and itself."""
    n = event.seq_len
    assert event.block_size == block_size and len(event.block_table) == math.ceil(n / block_size)
    weights = torch.tensor(event.weights)  # [heads, seq_len]
    scores = torch.tensor(event.scores)
    torch.testing.assert_close(weights, reference[:, n - 1, :n], rtol=1e-4, atol=1e-6)
    ends = list(range(block_size, n, block_size)) + [n]
    for b, end in enumerate(ends):
        m = scores[:, :end].max(-1).values
        torch.testing.assert_close(torch.tensor(event.running_max)[:, b], m)
        expected = (scores[:, :end] - m[:, None]).exp().sum(-1)
        torch.testing.assert_close(torch.tensor(event.running_sum)[:, b], expected)
    # The scores themselves, up to the constant softmax removes: log-ratios of the weights.
    diffs = scores - scores.max(-1, keepdim=True).values
    ref = reference[:, n - 1, :n].clamp_min(1e-30).log()
    torch.testing.assert_close(diffs, ref - ref.max(-1, keepdim=True).values, rtol=0, atol=2e-3)


@settings(max_examples=examples(5), deadline=None)
@example(block_size=1, layer=0, budget=7, backend="cpu").via("the smallest block")
@example(block_size=16, layer=1, budget=7, backend="torch").via("the largest block")
@given(
    block_size=st.integers(1, 16),
    layer=st.integers(0, 1),
    budget=st.integers(6, 12),
    backend=st.sampled_from(["cpu", "torch"]),  # its fused layer calls `attend`; plain `forward`
)
def test_the_probe_equals_the_reference_attention(
    tiny_llama: Path, block_size, layer, budget, backend
):
    """`r0`'s prompt is chunked (the budget is under its length) beside `other`'s decodes; once
    it decodes, `r1` arrives with the same first 17 prompt tokens: a prefix-cache hit on each
    full block of them, then its chunks and decodes beside the others. The probe follows `r0`,
    then `r1`: every step that runs the probed request tells its attention, equal to
    transformers'."""
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama),
            num_threads=1,
            attention_backend=backend,
            block_size=block_size,
            num_kv_blocks=max(8, 128 // block_size),
            max_num_batched_tokens=budget,
            max_num_seqs=4,
            enable_prefix_caching=True,
        )
    )
    events: list = []
    # Through JSON, as --record/--replay and the server's event stream carry it.
    engine.subscribe(
        lambda e: events.append(event_from_dict(json.loads(json.dumps(event_to_dict(e)))))
    )
    shared = [(7 * i) % 200 + 3 for i in range(17)]
    prompts = {
        "other": [40, 41, 42],
        "r0": shared + [11, 12, 13],
        "r1": shared + [21, 22, 23, 24, 25, 26],
    }
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs: dict[str, list[int]] = {}
    num_cached = 0
    engine.add_request("other", prompts["other"], SamplingParams(max_tokens=30, ignore_eos=True))
    engine.probe_attention("r0", layer)
    engine.add_request("r0", prompts["r0"], params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = list(out.outputs[0].token_ids)
            num_cached = max(num_cached, out.num_cached_tokens or 0)
        if "r1" not in outputs and outputs.get("r0"):  # r0 decodes: r1 arrives, probed
            switch = max(e.step for e in events if e.kind == "step_summary")
            engine.probe_attention("r1", layer)
            engine.add_request("r1", prompts["r1"], params)
            outputs["r1"] = []
    engine.probe_attention(None)
    probes = [e for e in events if isinstance(e, AttentionProbed)]
    for rid in ("r0", "r1"):
        prompt = prompts[rid]
        reference = hf_attentions(tiny_llama, prompt + outputs[rid])[layer][0]  # [heads, n, n]
        mine = [e for e in probes if e.request_id == rid]
        assert all(e.layer == layer for e in mine)
        # One a step the request ran while probed.
        ran = [e.step for e in events if e.kind == "request_scheduled" and e.request_id == rid]
        assert [e.step for e in mine] == (ran if rid == "r1" else [s for s in ran if s <= switch])
        for e in mine:
            check_probe(e, reference, block_size)
    after = [events[i + 1].kind for i, e in enumerate(events) if isinstance(e, AttentionProbed)]
    assert set(after) == {"attention_computed"}  # each right before its step's attention summary
    assert any(e.seq_len < len(prompts[e.request_id]) for e in probes), "a chunk probed"
    assert num_cached >= block_size * (17 // block_size), "r1 hit r0's cached prefix"
    r1 = [e for e in probes if e.request_id == "r1"]
    assert r1[0].seq_len > num_cached, "r1's first step: a chunk after its cached prefix"


def test_the_probe_is_off_by_default_and_removed_when_stopped(tiny_llama: Path):
    """No probe: the layer's attention is the backend's own object and no event is sent; a
    probe wraps only its layer, and stopping puts the very object back."""
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(tiny_llama), num_threads=1, block_size=4))
    layers = engine.runner.model.model.layers
    originals = [layer.self_attn.attn for layer in layers]
    events: list = []
    engine.subscribe(events.append)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine.add_request("a", [5, 6, 7], params)
    engine.run_until_done()
    assert not any(isinstance(e, AttentionProbed) for e in events)
    engine.probe_attention("b", layer=1)
    assert layers[0].self_attn.attn is originals[0] and layers[1].self_attn.attn is not originals[1]
    engine.add_request("b", [5, 6, 7], params)
    engine.run_until_done()
    assert sum(isinstance(e, AttentionProbed) for e in events) == 3
    engine.probe_attention(None)
    assert [layer.self_attn.attn for layer in layers] == originals
    with pytest.raises(ValueError, match="layer 2 out of range: the model has 2 layers"):
        engine.probe_attention("b", layer=2)
