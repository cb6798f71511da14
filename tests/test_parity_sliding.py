"""Greedy parity with transformers for the models with sliding windows: Mistral, Qwen2 with
`use_sliding_window`, Gemma 2 and Gemma 3's text model.

test_parity.py's oracle and scheduling configurations (block sizes 1 and sizes that do not
divide the prompts, KV budgets that force preemption, chunked prefill, prefix caching on and
off), on tiny random checkpoints whose windows (4-6 tokens) every prompt (14-52 tokens) and
every completion outgrows, so a sliding layer that saw one token too many or too few, on any
path (a fresh prefill, a chunk, a prefix-cache hit, a decode), changes the tokens. Each model's
config makes its own differences matter: Gemma's scale (`query_pre_attn_scalar` far from
head_dim), small soft-caps, Gemma 3's two RoPE bases with linear scaling on the global layers.

The engine runs with attention_backend="torch" (the reference) and with the default backend (on
a CPU, the numba kernel, which reads only the blocks in each query's window). The CPU backend's
other fast layers (numba RMSNorm and RoPE, packed matmuls) also run around the torch attention
in a test here, which shows that none of its Llama-shaped classes is given to a Gemma model.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import example, given, settings
from test_parity import engine_configs, run_nanovllm
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.core.kv_cache_interface import get_kv_cache_config, layer_specs
from nanovllm.engine.parts import EngineParts
from nanovllm.models.attention import TorchAttention
from nanovllm.models.loader import load_model_args

# Tiny models: torch's worker threads would only add hand-off cost (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_TOKENS = 12
VOCAB = 512

MODELS = {
    "mistral-w6": dict(arch="mistral", extra=dict(sliding_window=6)),
    # Layer 0 full, layer 1 sliding (transformers' `max_window_layers`).
    "qwen2-w5": dict(
        arch="qwen2", extra=dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)
    ),
    "gemma2-w4": dict(
        arch="gemma2",
        tie=True,
        extra=dict(
            sliding_window=4,
            query_pre_attn_scalar=4,  # (a scale twice 1/sqrt(head_dim)'s)
            attn_logit_softcapping=3.0,
            final_logit_softcapping=5.0,
        ),
    ),
    "gemma3-w5": dict(
        arch="gemma3",
        num_layers=3,
        tie=True,
        extra=dict(
            sliding_window=5,
            query_pre_attn_scalar=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    ),
}

# The attention backends that run these models (None: the default, numba's kernel on a CPU).
BACKENDS = ("torch", None)


def make_prompts(seed: int = 0) -> list[list[int]]:
    """Five prompts of 14-52 tokens, three of them sharing a 20-token prefix (prefix caching)."""
    rng = random.Random(seed)
    shared = [rng.randrange(2, VOCAB) for _ in range(20)]
    prompts = []
    for i in range(5):
        if i % 2:
            prompts.append([rng.randrange(2, VOCAB) for _ in range(rng.randint(14, 52))])
        else:
            prompts.append(shared + [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 32))])
    return prompts


class Checkpoints(dict):
    """Each tiny model with its prompts and transformers' greedy outputs, built on first use."""

    def __init__(self, tmp_path_factory) -> None:
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name: str) -> tuple[Path, list[list[int]], list[list[int]]]:
        path = make_model(self.tmp_path_factory.mktemp(name), vocab_size=VOCAB, **MODELS[name])
        prompts = make_prompts()
        self[name] = (path, prompts, hf_greedy(path, prompts, MAX_TOKENS))
        return self[name]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODELS))
@settings(max_examples=examples(6), deadline=None)
@given(config=engine_configs)
# The corners, every run: one-token blocks, preemption and 5-token chunks with prefix caching;
# blocks of 3 (dividing neither window nor prefix) without it.
@example(
    config=dict(
        block_size=1,
        kv_slots=64,
        max_num_batched_tokens=5,
        max_num_seqs=3,
        enable_prefix_caching=True,
    )
)
@example(
    config=dict(
        block_size=3,
        kv_slots=96,
        max_num_batched_tokens=17,
        max_num_seqs=8,
        enable_prefix_caching=False,
    )
)
def test_greedy_matches_transformers_past_the_window(
    checkpoints, name: str, backend: str, config: dict
) -> None:
    path, prompts, expected = checkpoints[name]
    config = dict(config)
    config["num_kv_blocks"] = same_kv_memory(path, config.pop("kv_slots"), config["block_size"])
    got = run_nanovllm(path, prompts, attention_backend=backend, **config)
    assert got == expected


def same_kv_memory(path, kv_slots: int, block_size: int) -> int:
    """The blocks that hold as many K/V bytes as `kv_slots` slots of every layer: with KV cache
    groups a block is one layer of each group (`num_kv_tensors` layers), not every layer; and a
    sliding group's null block is one of them."""
    _, args = load_model_args(path)
    specs = layer_specs(args.layer_types, args.sliding_window, args.num_hidden_layers, block_size)
    kv_cache_config = get_kv_cache_config(specs)
    layer_slots = kv_slots * args.num_hidden_layers
    blocks = layer_slots // (block_size * kv_cache_config.num_kv_tensors)
    return max(blocks + kv_cache_config.has_sliding_window, 1)


@pytest.mark.parametrize("name", ["gemma2-w4", "gemma3-w5"])
def test_gemma_under_the_cpu_backends_fast_layers(checkpoints, name: str) -> None:
    """The CPU backend's numba norms and RoPE and packed matmuls, with torch attention: the
    same tokens (its Llama RMSNorm and fused attention layer must not reach a Gemma model)."""
    from nanovllm.backends.cpu import NumbaAttention, NumbaRMSNorm
    from nanovllm.models.gemma import GemmaRMSNorm

    path, prompts, expected = checkpoints[name]
    llm = LLM(
        str(path),
        attention_backend="cpu",
        parts=EngineParts(attention_cls=TorchAttention),
        block_size=4,
        enable_prefix_caching=True,
    )
    model = llm.llm_engine.runner.model
    kinds = {type(m) for m in model.modules()}
    assert GemmaRMSNorm in kinds and not kinds & {NumbaRMSNorm, NumbaAttention}
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected


@pytest.mark.parametrize("name", list(MODELS))
def test_logprobs_match_transformers_along_the_completion(checkpoints, name: str) -> None:
    """Each completion token's logprob, against transformers' over the whole sequence at once:
    sharper than greedy tokens, which some mistakes cannot flip (the final soft-cap keeps the
    logits' order). Chunked prefill, blocks of 3 and a prefix-cache hit on the second prompt."""
    from transformers import AutoModelForCausalLM

    path, prompts, _ = checkpoints[name]
    prompts = [prompts[0], prompts[2]]  # (sharing a 20-token prefix)
    llm = LLM(
        str(path),
        attention_backend="torch",
        block_size=3,
        max_num_batched_tokens=17,
        max_num_seqs=1,
        enable_prefix_caching=True,
    )
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert outs[1].num_cached_tokens > 0
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for prompt, out in zip(prompts, outs):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        expected = logits.log_softmax(-1)  # [MAX_TOKENS, vocab]
        got = [out.outputs[0].logprobs[j][t].logprob for j, t in enumerate(tokens)]
        want = [expected[j, t].item() for j, t in enumerate(tokens)]
        assert got == pytest.approx(want, abs=1e-4)


def test_a_window_lets_a_request_longer_than_the_cache_run(checkpoints) -> None:
    """A sliding model holds only its window's blocks (and one step's), so a request needing 41
    slots runs in a cache of 5 usable blocks of 4 (20 slots), chunked 5 tokens a step, and
    gives transformers' tokens; with every layer kept full the same request is refused."""
    path, _, _ = checkpoints["mistral-w6"]
    prompt = [(7 * i) % 500 + 2 for i in range(30)]
    options = dict(
        block_size=4, num_kv_blocks=6, max_num_batched_tokens=5, attention_backend="torch"
    )
    llm = LLM(str(path), **options)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    assert out[0].outputs[0].token_ids == hf_greedy(path, [prompt], 12)[0]
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0
    full = LLM(str(path), disable_hybrid_kv_cache_manager=True, **options)
    with pytest.raises(ValueError, match="more than the whole KV cache"):
        full.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
