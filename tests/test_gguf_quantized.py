"""A GGUF file's Q8_0 / Q4_0 weights kept quantized in memory (models/quantized_linear.py,
backends/cpu_quantized.py): greedy output through the reference layers (dequantize, then
`F.linear`) is token for token the output of the same file dequantized at load
(`dequantize_gguf=True`), and so is the CPU backend's float32 C kernel's (its default where it
builds) and numba's on these files; the model holds the file's blocks, not float32 copies of them."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")

from tiny_gguf import write_gguf  # noqa: E402
from tiny_models import make_model  # noqa: E402

from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.backends.cpu_quantized import CQuantizedMatmul, NumbaQuantizedMatmul  # noqa: E402
from nanovllm.backends.cpu_quantized_int8 import Int8QuantizedMatmul  # noqa: E402
from nanovllm.kernels import cpu_quantized_matmul_fp32, cpu_quantized_matmul_int8  # noqa: E402
from nanovllm.models.linear import QKVParallelLinear  # noqa: E402
from nanovllm.models.loader import load_model  # noqa: E402
from nanovllm.models.model_layers import ModelLayers  # noqa: E402
from nanovllm.models.quantized_linear import QuantizedWeight, quantized_layers  # noqa: E402

PROMPTS = [[5, 17, 42, 99], [200, 3, 7], [11, 12, 13, 14, 15, 16, 250]]
MAX_TOKENS = 10
FILES = {  # (tied embeddings: the LM head reads the embedding's blocks)
    "q8_0": dict(embed="Q8_0", attn="Q8_0", mlp="Q8_0", norm="F32"),
    "q4_0": dict(embed="Q4_0", attn="Q4_0", mlp="Q4_0", norm="F32"),
}


@pytest.fixture(scope="module", params=list(FILES))
def gguf_file(request, tmp_path_factory):
    folder = make_model(tmp_path_factory.mktemp("hf"), arch="llama", tie=True, seed=5)
    out = tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf"
    return write_gguf(folder, out, FILES[request.param]), request.param.upper()


def greedy_tokens(path, **kwargs) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(path), num_kv_blocks=32, block_size=4, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], llm


def quantized_modules(llm: LLM) -> list:
    return [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, QuantizedWeight)]


@pytest.mark.slow
def test_kept_quantized_generates_what_dequantized_at_load_does(gguf_file):
    """The reference layers (attention_backend="torch") run exactly the dequantized model's
    arithmetic: the same tokens. The CPU backend's numba kernels (its default choice) sum in
    another order (equal to rounding): on these files, the same tokens too.
    The layers hold the file's blocks, as many bytes as the file stores, and no float32 copy."""
    from nanovllm.models.gguf_loader import open_gguf

    path, qtype = gguf_file
    dense, dense_llm = greedy_tokens(path, attention_backend="torch", dequantize_gguf=True)
    assert not quantized_modules(dense_llm)
    del dense_llm
    for backend in ("torch", "cpu"):
        kept, llm = greedy_tokens(path, attention_backend=backend)
        assert kept == dense, backend
        layers = quantized_modules(llm)
        # q/k/v, o, gate/up, down per layer, the embedding and the (tied) LM head
        num_layers = llm.llm_engine.model_args.num_hidden_layers
        assert len(layers) == 4 * num_layers + 2
        assert {m.quantized_weight().qtype for m in layers} == {qtype}
        assert all(m.weight.device.type == "meta" for m in layers)
        fast = [m for m in layers if isinstance(m, NumbaQuantizedMatmul)]
        assert len(fast) == (4 * num_layers + 1 if backend == "cpu" else 0)
        model = llm.llm_engine.runner.model
        assert model.lm_head.quantized_weight() is model.model.embed_tokens.qweight
        held = sum(m.qweight.nbytes for m in layers if m.qweight is not None)
        stored = sum(int(t.n_bytes) for t in open_gguf(path).tensors if t.tensor_type.name == qtype)
        assert held == stored
    # Asked for, and with a C compiler, the CPU backend picks the int8 layers instead (x rounded
    # to int8 blocks, as llama.cpp does): logits move by about half a percent, so later greedy
    # tokens of these random tiny models may part from the reference's where two logits are
    # close; the first token of each prompt is the same.
    if cpu_quantized_matmul_int8.load() is not None:
        kept, llm = greedy_tokens(path, attention_backend="cpu", gguf_int8_activations=True)
        assert [t[0] for t in kept] == [t[0] for t in dense]
        fast = [m for m in quantized_modules(llm) if isinstance(m, Int8QuantizedMatmul)]
        assert len(fast) == 4 * llm.llm_engine.model_args.num_hidden_layers + 1


def test_the_c_kernel_layers_generate_what_the_reference_does(gguf_file):
    """The CPU backend's default where the C compiler builds its kernel: the float32 C layers,
    whose arithmetic is the reference's up to the order of float32 sums; the same greedy tokens
    as the reference layers (attention_backend="torch"), the LM head and every linear layer
    through the kernel."""
    if cpu_quantized_matmul_fp32.load() is None:
        pytest.skip("no C compiler: the float32 kernel is not built")
    path, _ = gguf_file
    reference, _ = greedy_tokens(path, attention_backend="torch")
    kept, llm = greedy_tokens(path, attention_backend="cpu")
    assert kept == reference
    fast = [m for m in quantized_modules(llm) if isinstance(m, CQuantizedMatmul)]
    assert len(fast) == 4 * llm.llm_engine.model_args.num_hidden_layers + 1


class OwnQKV(QKVParallelLinear):
    """A layer class that is not the engine's (as a lesson's own layers are)."""


def test_a_model_with_layers_of_its_own_loads_dequantized(gguf_file):
    """`quantized_layers` replaces only the engine's classes; a model that keeps a class of its
    own gets every tensor dequantized (its loader could not take blocks), and computes what the
    all-dense model computes. The quantized embedding returns the model's dtype."""
    path, _ = gguf_file
    cpu = torch.device("cpu")
    layers = quantized_layers(ModelLayers(qkv=OwnQKV))
    assert layers.qkv is OwnQKV and layers.row is not ModelLayers().row
    mixed = load_model(path, torch.float32, cpu, layers, 64)
    dense = load_model(path, torch.float32, cpu, ModelLayers(), 64)
    assert {
        m.quantized_weight().qtype for m in mixed.modules() if isinstance(m, QuantizedWeight)
    } == {"F32"}
    x = torch.randn(3, mixed.args.hidden_size)
    for name in ("mlp.gate_up_proj", "self_attn.o_proj"):
        ours, theirs = (
            mixed.model.layers[0].get_submodule(name),
            dense.model.layers[0].get_submodule(name),
        )
        inputs = x if name.startswith("mlp") else torch.randn(3, ours.input_size)
        assert torch.equal(ours(inputs), theirs(inputs))
    half = load_model(path, torch.bfloat16, cpu, quantized_layers(ModelLayers()), 64)
    assert half.model.embed_tokens(torch.tensor([1, 2])).dtype == torch.bfloat16
