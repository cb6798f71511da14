"""The `hybrid` scenario's model: the embedded model with sliding-window layers, built offline.

The embedded model is a Llama (every layer attends to every earlier token). Written out again as
a Qwen2 checkpoint with `use_sliding_window`, its layers from `max_window_layers` on see only
the last `SLIDING_WINDOW` tokens: the engine then keeps two KV cache groups, a full one (layers
0-1) and a sliding one (layers 2-3), each with its own block table per request. Qwen2 is Llama
with biases on q, k and v; zero biases leave every projection as it was. Nothing is downloaded:
the weights are the embedded model's, copied once into a folder under the temporary directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from nanovllm.viz.derived_model import derived_model_path

SLIDING_WINDOW = 32  # tokens a sliding layer's query sees (four blocks of 8)
MAX_WINDOW_LAYERS = 2  # layers from this one on slide


def hybrid_model_path() -> Path:
    """The folder of the embedded model as a Qwen2 with sliding-window layers (built once)."""
    return derived_model_path("hybrid", f"w{SLIDING_WINDOW}", _write_checkpoint)


def _write_checkpoint(source: Path, out: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    config.update(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        use_sliding_window=True,
        sliding_window=SLIDING_WINDOW,
        max_window_layers=MAX_WINDOW_LAYERS,
    )
    config.pop("attention_bias", None)
    tensors = load_file(source / "model.safetensors")
    for name, weight in list(tensors.items()):
        for proj in ("q_proj", "k_proj", "v_proj"):
            if name.endswith(f"self_attn.{proj}.weight"):
                bias = name.removesuffix("weight") + "bias"
                tensors[bias] = torch.zeros(weight.shape[0], dtype=weight.dtype)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, out / name)
