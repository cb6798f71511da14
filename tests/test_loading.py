"""Loading in the right dtype on the right device, and sizing the KV cache.

Oracles: the rule for `dtype="auto"` written out, a freshly built model (tied weights, rotary
tables), transformers' own forward pass in the same dtype, and the memory budget's arithmetic.
"""

from __future__ import annotations

import json

import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.config import EngineConfig
from nanovllm.executor.memory import budget_from_profile, cpu_kv_cache_budget, kv_bytes_per_block
from nanovllm.models import llama
from nanovllm.models.loader import load_model, resolve_dtype
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.rotary import RotaryEmbedding


def test_auto_dtype_is_float32_on_a_cpu_and_the_checkpoints_half_precision_on_a_gpu(
    monkeypatch,
) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for stored in ("bfloat16", "float16", "float32", None):
        assert resolve_dtype("auto", {"torch_dtype": stored}, cpu) == torch.float32
    assert resolve_dtype("auto", {"torch_dtype": "bfloat16"}, cuda) == torch.bfloat16
    assert resolve_dtype("auto", {"dtype": "float16"}, cuda) == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", {"torch_dtype": "float32"}, cuda) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", {"torch_dtype": "float32"}, cuda) == torch.float16
    assert resolve_dtype("float16", {"torch_dtype": "bfloat16"}, cpu) == torch.float16


def test_the_model_is_built_in_its_dtype_on_its_device(tiny_llama, monkeypatch) -> None:
    """No float32 copy of the weights exists on the way to bfloat16: every parameter is created
    in bfloat16 on the target device, and the checkpoint fills it."""
    built = []
    real_init = llama.CausalLM.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        built.append({(p.device.type, p.dtype) for p in self.parameters()})

    monkeypatch.setattr(llama.CausalLM, "__init__", spy)
    config = json.loads((tiny_llama / "config.json").read_text())
    model = load_model(tiny_llama, torch.bfloat16, torch.device("cpu"), ModelLayers(), 128)
    assert built == [{("cpu", torch.bfloat16)}]
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("cpu", torch.bfloat16)}
    assert torch.get_default_dtype() == torch.float32, "the default dtype was not restored"
    fresh = RotaryEmbedding(model.args.head_dim, 128, model.args.rope_parameters)
    assert torch.equal(model.rotary.cos_cached, fresh.cos_cached)
    assert torch.equal(model.rotary.sin_cached, fresh.sin_cached)
    from safetensors.torch import load_file

    weights = load_file(str(tiny_llama / "model.safetensors"))
    gate_up = dict(model.named_parameters())["model.layers.0.mlp.gate_up_proj.weight"]
    up = weights["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(gate_up[up.shape[0] :], up.to(torch.bfloat16)), "up is gate_up's 2nd half"
    assert config["tie_word_embeddings"] is False


def test_tied_embeddings_stay_one_tensor(tmp_path) -> None:
    from tiny_models import make_model

    path = make_model(tmp_path / "tied", tie=True)
    model = load_model(path, torch.float32, torch.device("cpu"), ModelLayers(), 64)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bfloat16_logits_match_transformers_in_bfloat16(tiny_llama) -> None:
    from transformers import AutoModelForCausalLM

    prompt = [5, 17, 42, 9, 100, 3]
    llm = LLM(str(tiny_llama), dtype="bfloat16", block_size=4)
    assert llm.llm_engine.dtype == torch.bfloat16
    assert llm.llm_engine.runner.kv_caches[0][0].dtype == torch.bfloat16
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0, -1].float()
    expected = logits.log_softmax(-1)
    got = out.logprobs[0]
    for token, lp in got.items():
        assert abs(lp.logprob - expected[token].item()) < 0.1  # bfloat16 keeps ~3 digits


def test_the_kv_budget_is_what_the_gpu_has_left_after_weights_and_activations() -> None:
    gib = 2**30
    # 80 GiB at 0.9 = 72 GiB; 16 GiB in use (weights, context); a 2 GiB activation peak.
    assert budget_from_profile(80 * gib, 0.9, 16 * gib, 2 * gib) == 54 * gib
    assert budget_from_profile(8 * gib, 0.5, 3 * gib, 2 * gib) < 0
    # The CUDA graphs' pool is set aside too.
    assert budget_from_profile(80 * gib, 0.9, 16 * gib, 2 * gib, 3 * gib) == 51 * gib


def test_the_profile_step_is_the_largest_step_in_a_cache_just_big_enough(tiny_llama) -> None:
    """What a GPU's budget is measured on (`CudaModelRunner.profile_step`, run here on the
    CPU): `num_tokens` prompt tokens spread evenly over `num_seqs` fresh requests, each
    sampling, in a temporary cache whose every block one request holds, and a forward pass that
    runs on it."""
    from nanovllm.backends.cuda_runner import CudaModelRunner
    from nanovllm.executor.model_runner import ModelRunner

    model = LLM(str(tiny_llama), block_size=16).llm_engine.runner.model
    runner = CudaModelRunner(model, 16, torch.float32, torch.device("cpu"))
    for num_tokens, num_seqs in [(100, 7), (64, 64), (5, 9)]:
        out = runner.profile_step(num_tokens, num_seqs)
        lengths = [s.num_new_tokens for s in out.scheduled]
        assert sum(lengths) == num_tokens and len(lengths) == min(num_seqs, num_tokens)
        assert max(lengths) - min(lengths) <= 1
        assert all(s.samples and s.num_computed_tokens == 0 for s in out.scheduled)
        for s in out.scheduled:
            assert len(s.block_table) == -(-s.num_new_tokens // 16)
        blocks = sorted(b for s in out.scheduled for b in s.block_table)
        assert blocks == list(range(runner.kv_caches[0][0].shape[0]))
        # (The plain forward: CUDA events need a GPU.)
        logits = ModelRunner.forward_logits(runner, *runner.prepare_inputs(out))
        assert logits.shape == (len(lengths), runner.model.args.vocab_size)
        assert torch.isfinite(logits).all()


def test_a_cpu_engine_sizes_its_cache_from_available_memory_and_logs_it(
    tiny_llama, caplog, monkeypatch
) -> None:
    import logging

    # As if 8 MiB were available: the budget (2 MiB) holds fewer blocks than could be used.
    monkeypatch.setattr("nanovllm.engine.setup.available_cpu_memory", lambda: 8 * 2**20)
    caplog.set_level(logging.INFO, logger="nanovllm")
    llm = LLM(str(tiny_llama), block_size=16, max_num_seqs=512)
    engine = llm.llm_engine
    per_block = kv_bytes_per_block(engine.model_args, 16, torch.float32)
    useful = 512 * -(-engine.max_model_len // 16)
    assert cpu_kv_cache_budget(8 * 2**20) // per_block < useful
    assert engine.num_kv_blocks == cpu_kv_cache_budget(8 * 2**20) // per_block
    assert "CPU KV cache budget 2 MiB per rank (25% of 8 MiB available" in caplog.text
    assert f"KV cache size: {engine.num_kv_blocks * 16} tokens" in caplog.text
    assert "maximum concurrency" in caplog.text


def test_gpu_memory_utilization_is_checked() -> None:
    for bad in (0, 1.5, -0.1, "0.9", True):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            EngineConfig(gpu_memory_utilization=bad)
