"""The bench's two nanovllm rows on a GGUF file: `nanovllm` runs the float32 weights the peers
given a folder read (dequantized at load), `nanovllm-gguf` keeps the file's blocks as stored
(models/quantized_linear.py); each says which in its configuration."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from tiny_gguf import write_gguf  # noqa: E402
from tiny_models import make_model  # noqa: E402

from nanovllm.bench.engines import EngineLimits, make_engine  # noqa: E402
from nanovllm.models.quantized_linear import QuantizedWeight  # noqa: E402

TYPES = dict(embed="Q8_0", attn="Q8_0", mlp="Q8_0", norm="F32")


@pytest.mark.parametrize("name, kept", [("nanovllm", False), ("nanovllm-gguf", True)])
def test_each_nanovllm_row_runs_the_weights_it_says(tmp_path, name, kept) -> None:
    folder = make_model(tmp_path / "hf", arch="llama", tie=True, seed=3)
    path = write_gguf(folder, tmp_path / "tiny-q8_0.gguf", TYPES)
    engine = make_engine(name, str(path), EngineLimits(num_kv_blocks=16, max_model_len=64))
    info = engine.load()
    try:
        model = engine.engine.runner.model
        quantized = [m for m in model.modules() if isinstance(m, QuantizedWeight)]
        assert bool(quantized) == kept
        expected = "kept quantized as stored" if kept else "GGUF weights float32"
        assert expected in info["configuration"]
    finally:
        engine.close()
