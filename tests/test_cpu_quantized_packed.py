"""GGUF weights packed once for the VNNI kernel (backends/cpu_quantized_packed.py): the packed
tensor stands in for the file's blocks (the same rows, the same dequantized values, the same
bytes' count), the int8 layers multiply by it exactly as they multiply by the file's blocks
(bit for bit: the same micro-kernel), and a whole model served from packed weights generates
token for token what it generates unpacked, its tied LM head and embedding reading one packed
copy. Skipped where the VNNI kernel is not built (a CPU without avx512_vnni)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_gguf import random_blocks

from nanovllm.backends import cpu_quantized_packed
from nanovllm.backends.cpu_quantized_int8 import int8_quantized_linear
from nanovllm.backends.cpu_quantized_packed import VnniPackedTensor, prepack_quantized_weights
from nanovllm.kernels import cpu_quantized_matmul_vnni
from nanovllm.models.gguf_quants import QuantizedTensor

pytestmark = pytest.mark.skipif(
    cpu_quantized_matmul_vnni.load() is None,
    reason="the VNNI kernel is not built here (the CPU lacks avx512_vnni or avx512bw, or no compiler)",
)


@pytest.mark.parametrize("qtype", list(cpu_quantized_matmul_vnni.QTYPES))
def test_a_packed_tensor_answers_as_the_file_s_blocks_do(qtype):
    weight = QuantizedTensor(torch.from_numpy(random_blocks(45, 3, qtype, 2)), qtype, 96)
    packed = VnniPackedTensor(weight)
    assert packed.qtype == qtype and packed.shape == weight.shape
    assert packed.nbytes == 64 * weight.raw.shape[1]  # two panels of 32 rows
    ids = torch.tensor([44, 0, 7, 7, 31, 32])
    rows = packed.rows(ids)
    assert isinstance(rows, QuantizedTensor) and torch.equal(rows.raw, weight.raw[ids])
    assert torch.equal(packed.raw, weight.raw)
    assert torch.equal(packed.dequantize(), weight.dequantize())


def test_loading_into_a_packed_weight_is_a_clear_error():
    weight = QuantizedTensor(torch.from_numpy(random_blocks(40, 3, "Q8_0", 1)), "Q8_0", 96)
    packed = VnniPackedTensor(weight)
    with pytest.raises(ValueError, match=r"narrow on a Q8_0 weight \(40, 96\) packed"):
        packed.narrow(0, 0, 8)
    with pytest.raises(ValueError, match="copy_ on a Q8_0 weight .* read-only"):
        packed.copy_(weight)
    assert torch.equal(packed.raw, weight.raw)  # (unchanged)


@pytest.mark.parametrize("qtype", list(cpu_quantized_matmul_vnni.QTYPES))
@pytest.mark.parametrize("rows", [1, 5, 100])
def test_the_int8_layers_multiply_by_it_as_by_the_file_s_blocks(qtype, rows):
    weight = QuantizedTensor(torch.from_numpy(random_blocks(45, 3, qtype, 3)), qtype, 96)
    x, bias = torch.randn(rows, 96), torch.randn(45)
    y = int8_quantized_linear(x, VnniPackedTensor(weight), bias)
    assert torch.equal(y, int8_quantized_linear(x, weight, bias))
    # x the kernel does not take (bfloat16): the reference, through the unpacked rows
    xb = x.to(torch.bfloat16)
    expected = torch.nn.functional.linear(xb, weight.dequantize().to(torch.bfloat16), None)
    assert torch.equal(int8_quantized_linear(xb, VnniPackedTensor(weight), None), expected)


def test_prepacking_packs_what_the_kernel_serves_and_a_tied_head_s_embedding():
    def layer(qtype, **kw):
        blocks = 1 if qtype == "Q6_K" else 3
        columns = 256 if qtype == "Q6_K" else 96
        raw = torch.from_numpy(random_blocks(8, blocks, qtype, 1))
        return SimpleNamespace(qweight=QuantizedTensor(raw, qtype, columns), **kw)

    embedding = layer("Q4_0")
    head = SimpleNamespace(qweight=None, tied_to=(embedding,))
    k_quant, q8 = layer("Q6_K"), layer("Q8_0")
    dense = SimpleNamespace(qweight=QuantizedTensor.from_dense(torch.randn(8, 96)))
    before = embedding.qweight.raw.clone()
    assert prepack_quantized_weights([head, k_quant, q8, dense]) == 2
    assert isinstance(embedding.qweight, VnniPackedTensor) and head.qweight is None
    assert torch.equal(embedding.qweight.raw, before)
    assert isinstance(q8.qweight, VnniPackedTensor)
    assert isinstance(k_quant.qweight, QuantizedTensor) and isinstance(
        dense.qweight, QuantizedTensor
    )
    assert prepack_quantized_weights([head]) == 0  # packed already


def test_a_model_served_packed_generates_what_it_generates_unpacked(tmp_path, monkeypatch):
    """Q4_0 weights, tied embeddings, int8 activations: greedy tokens equal with and without
    packing (same arithmetic), every linear layer and the embedding hold packed panels, in as
    many bytes as the file's blocks (the tiny model's dims are multiples of 32)."""
    pytest.importorskip("gguf")
    from tiny_gguf import write_gguf
    from tiny_models import make_model

    from nanovllm import LLM, SamplingParams
    from nanovllm.models.gguf_loader import open_gguf
    from nanovllm.models.quantized_linear import QuantizedWeight

    folder = make_model(tmp_path / "hf", arch="llama", tie=True, seed=7)
    path = write_gguf(
        folder, tmp_path / "tiny.gguf", dict(embed="Q4_0", attn="Q4_0", mlp="Q4_0", norm="F32")
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in ([5, 17, 42, 99], [200, 3, 7], [11] * 9)]

    def run():
        llm = LLM(str(path), num_kv_blocks=32, block_size=4, gguf_int8_activations=True)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs], llm

    packed_tokens, llm = run()
    layers = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, QuantizedWeight)]
    held = [m.qweight for m in layers if m.qweight is not None]
    assert held and all(isinstance(w, VnniPackedTensor) for w in held)
    model = llm.llm_engine.runner.model
    assert model.lm_head.quantized_weight() is model.model.embed_tokens.qweight
    stored = sum(int(t.n_bytes) for t in open_gguf(path).tensors if t.tensor_type.name == "Q4_0")
    assert sum(w.nbytes for w in held) == stored
    del llm
    monkeypatch.setattr(cpu_quantized_packed, "can_pack", lambda weight: False)
    unpacked_tokens, llm = run()
    assert not any(
        isinstance(m.qweight, VnniPackedTensor)
        for m in llm.llm_engine.runner.model.modules()
        if isinstance(m, QuantizedWeight)
    )
    assert packed_tokens == unpacked_tokens
    assert np.array(packed_tokens).shape == (3, 12)


def test_two_ranks_serve_packed_weights_as_one_does(tmp_path):
    """Tensor parallelism over quantized layers: each rank loads its shard of the file's blocks
    (rows, or whole blocks of columns), then packs it; 2 ranks give the greedy tokens of 1.
    (Row-parallel shards round x by the same blocks of 32 as one rank does; only the order of
    the float sums differs, through the all-reduce.)"""
    pytest.importorskip("gguf")
    from tiny_gguf import write_gguf
    from tiny_models import make_model

    from nanovllm import LLM, SamplingParams

    folder = make_model(tmp_path / "hf", arch="llama", tie=True, seed=7)
    path = write_gguf(
        folder, tmp_path / "tiny.gguf", dict(embed="Q4_0", attn="Q4_0", mlp="Q8_0", norm="F32")
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in ([5, 17, 42, 99], [200, 3, 7], [11, 12] * 5)]
    tokens = []
    for ranks in (1, 2):
        llm = LLM(
            str(path), num_kv_blocks=32, block_size=4, gguf_int8_activations=True,
            tensor_parallel_size=ranks,
        )  # fmt: skip
        tokens.append([list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)])
        del llm
    assert tokens[0] == tokens[1]
