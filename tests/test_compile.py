"""`enforce_eager=False`: the compiled model computes what transformers computes.

The oracles are independent of nanovllm: transformers' greedy `generate` for the tokens, and
transformers' forward pass for the logits (every position of every request, computed whole,
against the compiled engine's paged and chunked steps). Compiling takes seconds, so each tiny
model is compiled once for the module (`compiled`) and its engine is reused.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest
import torch
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.backends import compilation, cpu_linear
from nanovllm.core.scheduler import ScheduledRequest, SchedulerOutput
from nanovllm.events import StepSummary
from nanovllm.request import Request

MAX_TOKENS = 10
MODELS = {
    "llama": dict(arch="llama", num_heads=4, num_kv_heads=2),
    "qwen3": dict(arch="qwen3", num_heads=4, num_kv_heads=2, head_dim=32),  # q/k norms
}


def unique_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


class Compiled(dict):
    """Per model: its folder, and an engine compiled once, with the graphs its start compiled."""

    def __init__(self, tmp_path_factory) -> None:
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name: str) -> tuple[Path, LLM, int]:
        path = make_model(self.tmp_path_factory.mktemp(name), vocab_size=256, **MODELS[name])
        before = unique_graphs()
        # A token budget of 7 cuts prompts into chunks and mixes them with decodes.
        llm = LLM(str(path), enforce_eager=False, max_num_batched_tokens=7, max_num_seqs=4)
        self[name] = (path, llm, unique_graphs() - before)
        return self[name]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Compiled:
    return Compiled(tmp_path_factory)


def prompts_of(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 256) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_greedy_matches_transformers_over_varying_steps(compiled, name: str) -> None:
    path, llm, _ = compiled[name]
    engine = llm.llm_engine
    assert engine.runner.model.compile_seconds is not None, "the model was not compiled"
    prompts = prompts_of([1, 3, 12, 5, 20, 2])
    # The last request runs longest, so the last steps decode it alone (one-token steps).
    max_tokens = [MAX_TOKENS] * (len(prompts) - 1) + [2 * MAX_TOKENS]
    longest = hf_greedy(path, prompts, 2 * MAX_TOKENS)
    expected = [tokens[:n] for tokens, n in zip(longest, max_tokens)]
    steps: list[StepSummary] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepSummary) else None)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    # The steps really varied: single decodes, chunked prefills, and both in one step.
    sizes = {sum(s.scheduled.values()) for s in steps}
    assert 1 in sizes and 7 in sizes and len(sizes) >= 4, sizes
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)


def test_compiled_logits_match_transformers_forward(compiled) -> None:
    """Chunked and mixed steps, driven by hand: each sampled row's logits against
    transformers' logits at that position of the whole sequence."""

    path, llm, _ = compiled["llama"]
    engine = llm.llm_engine
    runner = engine.runner
    runner.allocate_kv_cache(4)  # a cache of this test's own (block size 16), given back below
    try:
        check_logits(path, runner)
    finally:
        runner.allocate_kv_cache(engine.num_kv_blocks)
        engine.kv_cache_manager.reset_prefix_cache()  # the cached blocks' KV is gone


def check_logits(path: Path, runner) -> None:
    from transformers import AutoModelForCausalLM

    prompts = prompts_of([9, 13, 4], seed=1)
    a, b, c = (Request(str(i), p, SamplingParams(temperature=0), 0) for i, p in enumerate(prompts))
    # (request, new tokens, cached tokens, blocks): a chunk, then its rest beside a fresh
    # prefill, then single-token steps, the sizes the flat batch takes.
    # The last step recomputes c's last token alone (its KV is rewritten, the same values).
    plan = [
        [(a, 5, 0, [0]), (b, 13, 0, [1])],
        [(a, 4, 5, [0]), (c, 4, 0, [2])],
        [(c, 1, 3, [2])],
    ]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for step in plan:
        out = SchedulerOutput(step=0)
        for request, new, cached, blocks in step:
            out.scheduled.append(ScheduledRequest(request, new, cached, (blocks,), True, True))
        input_ids, positions, meta, rows = runner.prepare_inputs(out)
        got = runner.forward_logits(input_ids, positions, meta, rows)
        for row, (request, new, cached, _) in zip(got, step):
            tokens = request.all_token_ids[: cached + new]
            with torch.no_grad():
                want = hf(torch.tensor([tokens])).logits[0, -1]
            torch.testing.assert_close(row, want, rtol=1e-4, atol=1e-4)


def test_compilation_is_bounded_and_keeps_the_packed_matmuls(compiled) -> None:
    path, llm, at_start = compiled["llama"]
    # Start-up compiles one graph per region, shared by every layer, for every batch size.
    assert at_start == 2
    before = unique_graphs()
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    lengths = [1, 2, 3, 7, 8, 15, 16, 17, 30]
    llm.generate([{"prompt_token_ids": p} for p in prompts_of(lengths, 2)], params, use_tqdm=False)
    assert unique_graphs() == before, "a step compiled again"
    # Over this engine's whole life (the other tests' steps too): one graph per region.
    for region in llm.llm_engine.runner.model.compiled_regions:
        assert len(torch._dynamo.eval_frame._debug_get_cache_entry_list(region.__code__)) == 1
    # The compiled layers still multiply through the packed weights, by the op a graph
    # can call (when this torch can pack).
    if cpu_linear.can_prepack(torch.zeros(1, 1)):
        for layer in cpu_linear.linear_layers(llm.llm_engine.runner.model):
            assert isinstance(layer, cpu_linear.CompiledPackedMatmul)
    assert all(
        isinstance(layer, compilation.CompiledDecoderLayer)
        for layer in llm.llm_engine.runner.model.model.layers
    )


def test_a_compile_failure_falls_back_to_eager_with_one_warning(tiny_llama, monkeypatch) -> None:
    """As on a machine without a C compiler: inductor fails, the engine runs eagerly."""

    def no_compiler(graph, example_inputs):
        raise RuntimeError("Compiler: g++ is not found (simulated)")

    monkeypatch.setattr(compilation, "DEFAULT_BACKEND", no_compiler)
    with pytest.warns(UserWarning, match="torch.compile failed") as caught:
        llm = LLM(str(tiny_llama), enforce_eager=False)
    assert sum("torch.compile failed" in str(w.message) for w in caught) == 1
    model = llm.llm_engine.runner.model
    assert model.compile_seconds is None
    # Built as compiled layers, they run the plain forward: no regions were given to them.
    assert all(layer.regions is None for layer in model.model.layers)
    prompts = prompts_of([4, 11])
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(tiny_llama, prompts, MAX_TOKENS)


def test_enforce_eager_never_calls_torch_compile(tiny_llama, monkeypatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("torch.compile called with enforce_eager=True")

    monkeypatch.setattr(torch, "compile", forbidden)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for options in (dict(), dict(enforce_eager=True)):  # the default is eager
        llm = LLM(str(tiny_llama), **options)
        assert llm.llm_engine.config.enforce_eager is True
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)
    with pytest.raises(AssertionError, match="torch.compile called"):
        LLM(str(tiny_llama), enforce_eager=False)  # the same patch does catch a call


def test_the_enforce_eager_flag() -> None:
    from nanovllm.engine.generate_cli import add_engine_arguments, engine_options

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_options(parser.parse_args([]))["enforce_eager"] is True
    assert engine_options(parser.parse_args(["--enforce-eager"]))["enforce_eager"] is True
    assert engine_options(parser.parse_args(["--no-enforce-eager"]))["enforce_eager"] is False
    with pytest.raises(ValueError, match="enforce_eager"):
        LLM(enforce_eager="no")


def test_a_model_of_its_own_layers_runs_eagerly_with_one_warning(tmp_path) -> None:
    """Gemma's decoder layers are not Llama's, so the compiled regions do not fit them: with
    `enforce_eager=False` the engine still starts, says so once, and computes what
    transformers computes."""
    path = make_model(
        tmp_path, arch="gemma2", vocab_size=256, tie=True,
        extra=dict(sliding_window=4, attn_logit_softcapping=3.0, final_logit_softcapping=5.0),
    )  # fmt: skip
    with pytest.warns(UserWarning, match="no compiled form") as caught:
        llm = LLM(str(path), enforce_eager=False, attention_backend="torch")
    assert sum("no compiled form" in str(w.message) for w in caught) == 1
    assert llm.llm_engine.runner.model.compile_seconds is None
    prompts = prompts_of([4, 11])
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path, prompts, MAX_TOKENS)


def test_a_mixture_of_experts_runs_eagerly_with_one_warning(tmp_path) -> None:
    """Grouping tokens by expert gives shapes that change every step: a MoE model is not
    compiled (one warning), and computes what transformers computes."""
    path = make_model(tmp_path, arch="mixtral", vocab_size=256)
    with pytest.warns(UserWarning, match="mixture-of-experts") as caught:
        llm = LLM(str(path), enforce_eager=False)
    assert sum("mixture-of-experts" in str(w.message) for w in caught) == 1
    assert llm.llm_engine.runner.model.compile_seconds is None
    prompts = prompts_of([4, 11])
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(path, prompts, MAX_TOKENS)
