"""load_sharded: names mapped to fused shards, rank slices, and clear errors. No processes needed:
loading never communicates, so `as_tp_rank` builds any rank's shard in this process."""

from __future__ import annotations

import re

import pytest
import torch
from rank_checks import TinyBlock, write_checkpoint
from safetensors.torch import load_file, save_file
from torch import nn

from nanovllm.distributed import as_tp_rank
from nanovllm.models.embedding import ParallelLMHead, VocabParallelEmbedding
from nanovllm.models.sharded_loader import WeightLoadError, load_sharded

ARGS = dict(vocab=14, hidden=16, heads=4, kv_heads=2, head_size=4, inter=24)
P = "model.layers.0."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    write_checkpoint(path, **ARGS)
    return path


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_holds_its_slices_in_the_fused_layout(checkpoint, rank):
    full = load_file(checkpoint)
    with as_tp_rank(rank, 2):
        model = TinyBlock(**ARGS)
    load_sharded(model, [checkpoint])
    params = dict(model.named_parameters())
    q, k, v = (full[f"{P}self_attn.{m}_proj.weight"] for m in "qkv")
    rows = slice(rank * 8, rank * 8 + 8)  # 2 of 4 q heads; 1 of 2 kv heads (4 rows each)
    kv_rows = slice(rank * 4, rank * 4 + 4)
    expected_qkv = torch.cat([q[rows], k[kv_rows], v[kv_rows]])
    assert torch.equal(params[f"{P}self_attn.qkv_proj.weight"], expected_qkv)
    gate, up = full[f"{P}mlp.gate_proj.weight"], full[f"{P}mlp.up_proj.weight"]
    half = slice(rank * 12, rank * 12 + 12)
    assert torch.equal(params[f"{P}mlp.gate_up_proj.weight"], torch.cat([gate[half], up[half]]))
    down = full[f"{P}mlp.down_proj.weight"]
    assert torch.equal(params[f"{P}mlp.down_proj.weight"], down[:, half])
    embed = full["model.embed_tokens.weight"]
    assert torch.equal(params["model.embed_tokens.weight"], embed[rank * 7 : rank * 7 + 7])
    assert torch.equal(params[f"{P}self_attn.o_proj.bias"], full[f"{P}self_attn.o_proj.bias"])


def test_a_fused_checkpoint_loads_the_same(checkpoint, tmp_path):
    """A checkpoint storing qkv_proj / gate_up_proj already fused (shard None) loads too."""
    full = load_file(checkpoint)
    fused = dict(full)
    for kind in ("weight", "bias"):
        fused[f"{P}self_attn.qkv_proj.{kind}"] = torch.cat(
            [fused.pop(f"{P}self_attn.{m}_proj.{kind}") for m in "qkv"]
        )
    fused[f"{P}mlp.gate_up_proj.weight"] = torch.cat(
        [fused.pop(f"{P}mlp.gate_proj.weight"), fused.pop(f"{P}mlp.up_proj.weight")]
    )
    save_file(fused, str(tmp_path / "fused.safetensors"))
    with as_tp_rank(1, 2):
        a, b = TinyBlock(**ARGS), TinyBlock(**ARGS)
    load_sharded(a, [checkpoint])
    load_sharded(b, [tmp_path / "fused.safetensors"])
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


def test_missing_shard_unexpected_tensor_and_bad_shape_are_named(checkpoint, tmp_path):
    full = load_file(checkpoint)
    model = TinyBlock(**ARGS)
    cases = {
        re.escape("lacks 1 tensors: model.layers.0.self_attn.qkv_proj.weight (shard 'k')"): {
            n: t for n, t in full.items() if n != f"{P}self_attn.k_proj.weight"
        },
        "unexpected tensor 'model.layers.0.mlp.extra.weight'": {
            **full,
            f"{P}mlp.extra.weight": torch.zeros(2),
        },
        r"tensor 'model.layers.0.mlp.up_proj.weight' .* has shape \(23, 16\), expected \(24, 16\)": {
            **full,
            f"{P}mlp.up_proj.weight": torch.zeros(23, 16),
        },
    }
    for message, tensors in cases.items():
        path = tmp_path / "bad.safetensors"
        save_file(tensors, str(path))
        with pytest.raises(WeightLoadError, match=message):
            load_sharded(model, [path])


def test_tied_embeddings_load_through_either_name(tmp_path):
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = VocabParallelEmbedding(10, 4)
            self.lm_head = ParallelLMHead(10, 4).tie_weights(self.embed_tokens)

    table = torch.randn(10, 4)
    save_file({"embed_tokens.weight": table}, str(tmp_path / "tied.safetensors"))
    with as_tp_rank(1, 2):
        model = Tied()
    load_sharded(model, [tmp_path / "tied.safetensors"])
    assert torch.equal(model.lm_head.weight, table[5:])


def test_plain_unfused_modules_load_with_the_default_mapping(tmp_path):
    """A model with separate q_proj (no weight_loader) ignores the fusing map."""
    attn = nn.Module()
    attn.q_proj = nn.Linear(4, 4, bias=False)
    model = nn.Module()
    model.attn = attn
    w = torch.randn(4, 4)
    save_file({"attn.q_proj.weight": w}, str(tmp_path / "plain.safetensors"))
    report = load_sharded(model, [tmp_path / "plain.safetensors"])
    assert torch.equal(model.attn.q_proj.weight, w)
    assert report.tensors == 1 and report.bytes_read == report.bytes_in_files == 64
