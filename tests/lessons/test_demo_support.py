"""The lessons' derived demo models, kept under $NANOVLLM_HOME, follow the checkout they run from.

`windowed_model_path` links the demo model's weights and tokenizer into a model folder of its own
(lesson 16's sliding model). A folder written by another checkout, since removed, holds links
that lead nowhere; it must be written again, not returned.
"""

from __future__ import annotations

from nanovllm.lessons import demo_support
from nanovllm.lessons.workspace import HOME_ENV


def test_a_windowed_model_written_from_a_removed_checkout_is_written_again(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    path = demo_support.windowed_model_path(24)
    stale = tmp_path / "gone" / "tokenizer.json"  # (the old checkout's file, since removed)
    (path / "tokenizer.json").unlink()
    (path / "tokenizer.json").symlink_to(stale)
    again = demo_support.windowed_model_path(24)
    assert again == path
    assert (again / "tokenizer.json").is_file()
    assert all(f.exists() for f in again.iterdir())


def test_the_moe_model_is_the_demo_models_mlp_cut_into_experts(tmp_path, monkeypatch):
    """Lesson 17's model: every expert of a layer together, each weighted top_k / num_experts
    (undoing the scale that makes a token's top_k experts as strong as the whole MLP), compute
    the demo model's dense MLP; every other tensor is the demo model's; and it loads as a
    Mixtral of 4 experts, 2 per token, renormalised."""
    import json

    import torch
    from safetensors.torch import load_file

    from nanovllm.models.model_args import ModelArgs
    from nanovllm.models.moe import expert_mlp

    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    path = demo_support.moe_model_path()
    args = ModelArgs.from_config(json.loads((path / "config.json").read_text()))
    assert (args.num_experts, args.num_experts_per_tok, args.norm_topk_prob) == (4, 2, True)
    dense = load_file(str(demo_support.demo_model_path() / "model.safetensors"))
    moe = load_file(str(path / "model.safetensors"))
    assert all(torch.equal(moe[name], t) for name, t in dense.items() if ".mlp." not in name)
    x = torch.randn(
        3, dense["model.embed_tokens.weight"].shape[1], generator=torch.Generator().manual_seed(0)
    )
    for layer in range(args.num_hidden_layers):
        mlp, experts = f"model.layers.{layer}.mlp", f"model.layers.{layer}.block_sparse_moe.experts"
        gate, up = x @ dense[f"{mlp}.gate_proj.weight"].T, x @ dense[f"{mlp}.up_proj.weight"].T
        want = (torch.nn.functional.silu(gate) * up) @ dense[f"{mlp}.down_proj.weight"].T
        got = sum(
            expert_mlp(
                x,
                torch.cat([moe[f"{experts}.{e}.w1.weight"], moe[f"{experts}.{e}.w3.weight"]]),
                moe[f"{experts}.{e}.w2.weight"],
            )
            for e in range(4)
        ) * (2 / 4)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
