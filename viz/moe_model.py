"""The `moe` scenario's model: the embedded model as a mixture of experts, built offline.

The embedded model is a Llama with one MLP per layer. Written out again as a Mixtral, each
layer's MLP becomes `NUM_EXPERTS` experts, every one a copy of that MLP, behind a router with
random weights that sends each token to `TOP_K` of them. Mixtral renormalises the chosen
experts' weights to sum to 1, and equal experts then give back the MLP's own output: the text
is the embedded model's, while the router, random, decides where each token's work goes (and
sends more of it to some experts than to others). Nothing is downloaded: the weights are the
embedded model's, copied once into a folder under the temporary directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from nanovllm.viz.derived_model import derived_model_path

NUM_EXPERTS = 8  # Mixtral's: 8 experts, each token to 2 of them
TOP_K = 2
ROUTER_SEED = 0
ROUTER_STD = 0.1  # the router's weights: normal, this deviation (logits of a few units)


def moe_model_path() -> Path:
    """The folder of the embedded model as a Mixtral of `NUM_EXPERTS` equal experts (built
    once)."""
    return derived_model_path("moe", f"e{NUM_EXPERTS}k{TOP_K}", _write_checkpoint)


# The dense MLP's matrices -> Mixtral's names of each expert's.
_EXPERT_NAME = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def _write_checkpoint(source: Path, out: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    config.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        sliding_window=None,
        router_jitter_noise=0.0,
        output_router_logits=False,
    )
    for name in ("attention_bias", "mlp_bias", "pretraining_tp"):
        config.pop(name, None)
    dense = load_file(source / "model.safetensors")
    generator = torch.Generator().manual_seed(ROUTER_SEED)
    tensors = {}
    for name, weight in dense.items():
        prefix, dot, matrix = name.removesuffix(".weight").rpartition(".mlp.")
        if not dot:
            tensors[name] = weight
            continue
        moe = f"{prefix}.block_sparse_moe"
        for expert in range(NUM_EXPERTS):  # (copies: safetensors stores no shared tensors)
            tensors[f"{moe}.experts.{expert}.{_EXPERT_NAME[matrix]}.weight"] = weight.clone()
        if matrix == "gate_proj":
            router = torch.randn(NUM_EXPERTS, weight.shape[1], generator=generator)
            tensors[f"{moe}.gate.weight"] = (router * ROUTER_STD).to(weight.dtype)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, out / name)
