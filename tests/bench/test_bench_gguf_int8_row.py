"""The bench's `nanovllm-gguf-int8` row: a GGUF file's blocks kept as stored, and x rounded to
int8 blocks (`gguf_int8_activations=True`): its linear layers are the int8 kernels' (AMX's where
the CPU has it), and its configuration says so."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from tiny_gguf import write_gguf  # noqa: E402
from tiny_models import make_model  # noqa: E402

from nanovllm.backends.cpu_quantized_int8 import Int8QuantizedMatmul  # noqa: E402
from nanovllm.bench.engines import EngineLimits, make_engine  # noqa: E402
from nanovllm.kernels import cpu_quantized_matmul_amx, cpu_quantized_matmul_int8  # noqa: E402

TYPES = dict(embed="Q8_0", attn="Q8_0", mlp="Q8_0", norm="F32")


@pytest.mark.slow
@pytest.mark.skipif(cpu_quantized_matmul_int8.load() is None, reason="no C compiler")
def test_the_int8_row_runs_the_int8_layers(tmp_path) -> None:
    folder = make_model(tmp_path / "hf", arch="llama", tie=True, seed=3)
    path = write_gguf(folder, tmp_path / "tiny-q8_0.gguf", TYPES)
    limits = EngineLimits(num_kv_blocks=16, max_model_len=64)
    engine = make_engine("nanovllm-gguf-int8", str(path), limits)
    info = engine.load()
    try:
        layers = [
            m for m in engine.engine.runner.model.modules() if isinstance(m, Int8QuantizedMatmul)
        ]
        assert layers
        assert {m.amx for m in layers} == {cpu_quantized_matmul_amx.load() is not None}
        assert "kept quantized as stored, x rounded to int8 blocks" in info["configuration"]
    finally:
        engine.close()


@pytest.mark.slow
def test_the_gguf_row_names_its_kernel(tmp_path) -> None:
    """`nanovllm-gguf` (the reference's arithmetic): the float32 C kernel's layers where it
    builds, else numba's, and its configuration names which."""
    from nanovllm.backends.cpu_quantized import CQuantizedMatmul, NumbaQuantizedMatmul
    from nanovllm.kernels import cpu_quantized_matmul_fp32

    folder = make_model(tmp_path / "hf", arch="llama", tie=True, seed=3)
    path = write_gguf(folder, tmp_path / "tiny-q8_0.gguf", TYPES)
    limits = EngineLimits(num_kv_blocks=16, max_model_len=64)
    engine = make_engine("nanovllm-gguf", str(path), limits)
    info = engine.load()
    try:
        layers = [
            m for m in engine.engine.runner.model.modules() if isinstance(m, NumbaQuantizedMatmul)
        ]
        built = cpu_quantized_matmul_fp32.load() is not None
        assert layers and {isinstance(m, CQuantizedMatmul) for m in layers} == {built}
        name = "float32 C kernel (AVX2 FMA)" if built else "numba kernel"
        if built and not cpu_quantized_matmul_fp32.load().has_avx2():
            name = "float32 C kernel (plain C)"
        assert f"kept quantized as stored, {name}" in info["configuration"]
    finally:
        engine.close()
