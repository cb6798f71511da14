"""What each rank runs in the tensor-parallel tests: build a sharded layer, compare to the whole.

Every check builds the FULL weights from a seed (identically on every rank), computes the
unsharded reference with plain torch (nn.functional / nn.Linear / nn.Embedding), builds the
sharded layer on this rank, loads it through its `weight_loader` from the full tensors, runs it,
and returns the largest absolute difference from the reference. Rank 0 (the test process)
collects every rank's answer with `WorkerGroup.run_all`.

This module is imported by the spawned worker processes (the worker factory is pickled by
reference), so it lives beside the tests rather than inside them.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.distributed import (
    broadcast_object,
    broadcast_tensor_dict,
    get_tp_rank,
    get_tp_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from nanovllm.models.embedding import ParallelLMHead, VocabParallelEmbedding
from nanovllm.models.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from nanovllm.models.sharded_loader import load_sharded


def randn(seed: int, *shape: int) -> torch.Tensor:
    """Seeded on the CPU (identical on every rank), then moved to the default device."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cpu").to(torch.get_default_device())


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return (a - b).abs().max().item() if a.numel() else 0.0


def reference_attention(q, k, v, num_heads: int, num_kv_heads: int, head_size: int):
    """Causal grouped-query attention over one sequence, the plain way (the oracle)."""
    n = q.shape[0]
    q = q.view(n, num_heads, head_size).transpose(0, 1)  # [heads, n, d]
    k = k.view(n, num_kv_heads, head_size).transpose(0, 1)  # [kv_heads, n, d]
    v = v.view(n, num_kv_heads, head_size).transpose(0, 1)
    group = num_heads // num_kv_heads
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [heads, n, d]
    return out.transpose(0, 1).reshape(n, num_heads * head_size)


class RankChecks:
    """A rank's worker in the tests; every method returns this rank's error (or a value)."""

    def __init__(self, rank: int, device: str | None = None) -> None:
        self.rank = rank
        assert get_tp_rank() == rank
        if device == "cuda":  # layers and tensors on this rank's GPU (the gpu-marked tests)
            torch.set_default_device(torch.device("cuda", torch.cuda.current_device()))

    def whoami(self) -> tuple[int, int, int]:
        return get_tp_rank(), get_tp_world_size(), os.getpid()

    def echo(self, *args, **kwargs):
        return args, kwargs

    def column(self, seed: int, n: int, d_in: int, d_out: int, bias: bool, gather: bool) -> float:
        x, ref, layer = self._linear(
            seed, n, d_in, d_out, bias, lambda: ColumnParallelLinear(d_in, d_out, bias, gather)
        )
        out = layer(x)
        if not gather:  # this rank's slice of the output features
            size = d_out // get_tp_world_size()
            ref = ref[:, self.rank * size : (self.rank + 1) * size]
        return max_diff(out, ref)

    def row(self, seed: int, n: int, d_in: int, d_out: int, bias: bool, parallel_in: bool):
        x, ref, layer = self._linear(
            seed, n, d_in, d_out, bias, lambda: RowParallelLinear(d_in, d_out, bias, parallel_in)
        )
        if parallel_in:
            size = d_in // get_tp_world_size()
            x = x[:, self.rank * size : (self.rank + 1) * size]
        return max_diff(layer(x), ref)

    @staticmethod
    def _linear(seed: int, n: int, d_in: int, d_out: int, bias: bool, make_layer):
        """Input, the whole layer's output, and the parallel layer loaded from the full weights."""
        w, x = randn(seed, d_out, d_in), randn(seed + 1, n, d_in)
        b = randn(seed + 2, d_out) if bias else None
        layer = make_layer()
        layer.weight.weight_loader(layer.weight, w)
        if bias:
            layer.bias.weight_loader(layer.bias, b)
        return x, F.linear(x, w, b), layer

    def mlp(self, seed: int, n: int, hidden: int, inter: int, fused_checkpoint: bool) -> float:
        """SwiGLU with gate/up merged (column) and down (row): equal to three nn.Linear."""
        gate, up = randn(seed, inter, hidden), randn(seed + 1, inter, hidden)
        down, x = randn(seed + 2, hidden, inter), randn(seed + 3, n, hidden)
        ref = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)
        gate_up = MergedColumnParallelLinear(hidden, [inter, inter])
        if fused_checkpoint:  # a checkpoint storing [gate; up] as one tensor
            gate_up.weight.weight_loader(gate_up.weight, torch.cat([gate, up]))
        else:
            gate_up.weight.weight_loader(gate_up.weight, up, 1)  # any order
            gate_up.weight.weight_loader(gate_up.weight, gate, 0)
        down_proj = RowParallelLinear(inter, hidden)
        down_proj.weight.weight_loader(down_proj.weight, down)
        g, u = gate_up(x).chunk(2, dim=-1)  # [n, inter / tp] each
        return max_diff(down_proj(F.silu(g) * u), ref)

    def attention(
        self,
        seed: int,
        n: int,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        bias: bool,
    ) -> dict:
        """q/k/v fused (column, by heads, KV heads replicated if few) + o_proj (row) = whole."""
        q_w = randn(seed, num_heads * head_size, hidden)
        k_w = randn(seed + 1, num_kv_heads * head_size, hidden)
        v_w = randn(seed + 2, num_kv_heads * head_size, hidden)
        o_w = randn(seed + 3, hidden, num_heads * head_size)
        x = randn(seed + 4, n, hidden)
        q_b, k_b, v_b = (
            (
                randn(seed + 5, q_w.shape[0]),
                randn(seed + 6, k_w.shape[0]),
                randn(seed + 7, v_w.shape[0]),
            )
            if bias
            else (None, None, None)
        )
        ref = F.linear(
            reference_attention(
                F.linear(x, q_w, q_b),
                F.linear(x, k_w, k_b),
                F.linear(x, v_w, v_b),
                num_heads,
                num_kv_heads,
                head_size,
            ),
            o_w,
        )
        qkv = QKVParallelLinear(hidden, head_size, num_heads, num_kv_heads, bias=bias)
        for shard, w, b in (("v", v_w, v_b), ("q", q_w, q_b), ("k", k_w, k_b)):
            qkv.weight.weight_loader(qkv.weight, w, shard)
            if bias:
                qkv.bias.weight_loader(qkv.bias, b, shard)
        o_proj = RowParallelLinear(num_heads * head_size, hidden)
        o_proj.weight.weight_loader(o_proj.weight, o_w)
        q, k, v = qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], dim=-1)
        local = reference_attention(q, k, v, qkv.num_heads, qkv.num_kv_heads, head_size)
        return {
            "diff": max_diff(o_proj(local), ref),
            "num_kv_heads": qkv.num_kv_heads,
            "replicas": qkv.num_kv_head_replicas,
            "weight_shape": tuple(qkv.weight.shape),
        }

    def embedding(self, seed: int, n: int, vocab: int, dim: int) -> dict:
        table, ids = (
            randn(seed, vocab, dim),
            torch.randint(
                0, vocab, (n,), generator=torch.Generator().manual_seed(seed + 1), device="cpu"
            ).to(torch.get_default_device()),
        )
        layer = VocabParallelEmbedding(vocab, dim)
        layer.weight.weight_loader(layer.weight, table)
        return {
            "diff": max_diff(layer(ids), F.embedding(ids, table)),
            "rows": layer.weight.shape[0],
            "padded": layer.num_embeddings_padded,
        }

    def lm_head(self, seed: int, n: int, vocab: int, dim: int, tied: bool) -> float:
        table, hidden = randn(seed, vocab, dim), randn(seed + 1, n, dim)
        head = ParallelLMHead(vocab, dim)
        if tied:
            embed = VocabParallelEmbedding(vocab, dim)
            embed.weight.weight_loader(embed.weight, table)
            head.tie_weights(embed)
        else:
            head.weight.weight_loader(head.weight, table)
        return max_diff(head(hidden), F.linear(hidden, table))

    def collectives(self, seed: int) -> dict:
        """all-reduce / all-gather / broadcasts against their definitions."""
        world = get_tp_world_size()
        mine = randn(seed + self.rank, 3, 4)
        everyone = [randn(seed + r, 3, 4) for r in range(world)]
        reduced = tensor_model_parallel_all_reduce(mine.clone())
        gathered = tensor_model_parallel_all_gather(mine, dim=-1)
        obj = broadcast_object({"seed": seed, "from": self.rank} if self.rank == 0 else None)
        inputs = {"ids": torch.arange(seed % 7 + 1), "n": seed, "names": ["a", "b"]}
        got = broadcast_tensor_dict(inputs if self.rank == 0 else None)
        return {
            "reduce": max_diff(reduced, sum(everyone)),
            "gather": max_diff(gathered, torch.cat(everyone, dim=-1)),
            "object": obj == {"seed": seed, "from": 0},
            "inputs": got["n"] == seed
            and got["names"] == ["a", "b"]
            and torch.equal(got["ids"], inputs["ids"]),
        }

    def load(self, path: str, build_args: dict) -> dict:
        """load_sharded from a real safetensors file; returns errors and bytes read vs held."""
        from safetensors.torch import load_file

        model = TinyBlock(**build_args)
        report = load_sharded(model, [path])
        full = load_file(path)
        x = randn(99, 5, build_args["hidden"])
        ids = torch.arange(5) % build_args["vocab"]
        held = sum(p.numel() * p.element_size() for p in model.parameters())
        return {
            "diff": max_diff(model(ids, x), TinyBlock.reference(full, ids, x, **build_args)),
            "bytes_read": report.bytes_read,
            "bytes_held": held,
            "bytes_in_file": report.bytes_in_files,
        }

    def sleep(self, seconds_by_rank: dict[int, float]) -> int:
        time.sleep(seconds_by_rank.get(self.rank, 0.0))
        return self.rank

    def all_reduce_unless(self, failing_rank: int, how: str) -> float:
        """Every rank all-reduces, except `failing_rank`, which raises or exits instead."""
        if self.rank == failing_rank:
            if how == "raise":
                raise ValueError(f"rank {self.rank} cannot go on")
            os._exit(3)
        return tensor_model_parallel_all_reduce(torch.ones(4)).sum().item()


class TinyBlock(nn.Module):
    """One decoder block with Hugging Face's parameter names, built from the parallel layers.

    Its checkpoint (`write_checkpoint`) stores q_proj, k_proj, v_proj, gate_proj and up_proj
    separately, as Hugging Face does; the model holds them fused (qkv_proj, gate_up_proj).
    """

    def __init__(
        self, vocab: int, hidden: int, heads: int, kv_heads: int, head_size: int, inter: int
    ):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(vocab, hidden)
        layer = nn.Module()
        layer.input_layernorm = nn.Module()
        layer.input_layernorm.weight = nn.Parameter(torch.empty(hidden), requires_grad=False)
        layer.self_attn = nn.Module()
        layer.self_attn.qkv_proj = QKVParallelLinear(hidden, head_size, heads, kv_heads, bias=True)
        layer.self_attn.o_proj = RowParallelLinear(heads * head_size, hidden, bias=True)
        layer.mlp = nn.Module()
        layer.mlp.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter])
        layer.mlp.down_proj = RowParallelLinear(inter, hidden)
        self.model.layers = nn.ModuleList([layer])
        self.lm_head = ParallelLMHead(vocab, hidden)
        self.head_size = head_size

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        layer = self.model.layers[0]
        attn = layer.self_attn.qkv_proj
        h = self.model.embed_tokens(ids) + x
        q, k, v = attn(h * layer.input_layernorm.weight).split(
            [attn.q_size, attn.kv_size, attn.kv_size], dim=-1
        )
        a = reference_attention(q, k, v, attn.num_heads, attn.num_kv_heads, self.head_size)
        h = h + layer.self_attn.o_proj(a)
        g, u = layer.mlp.gate_up_proj(h).chunk(2, dim=-1)
        h = h + layer.mlp.down_proj(F.silu(g) * u)
        return self.lm_head(h)

    @staticmethod
    def reference(full: dict, ids, x, vocab, hidden, heads, kv_heads, head_size, inter):
        """The same block computed from the full checkpoint tensors with plain torch."""
        p = "model.layers.0."
        h = F.embedding(ids, full["model.embed_tokens.weight"]) + x
        n = h * full[p + "input_layernorm.weight"]
        q, k, v = (
            F.linear(n, full[f"{p}self_attn.{m}.weight"], full[f"{p}self_attn.{m}.bias"])
            for m in ("q_proj", "k_proj", "v_proj")
        )
        a = reference_attention(q, k, v, heads, kv_heads, head_size)
        h = h + F.linear(a, full[p + "self_attn.o_proj.weight"], full[p + "self_attn.o_proj.bias"])
        g = F.linear(h, full[p + "mlp.gate_proj.weight"])
        u = F.linear(h, full[p + "mlp.up_proj.weight"])
        h = h + F.linear(F.silu(g) * u, full[p + "mlp.down_proj.weight"])
        return F.linear(h, full["lm_head.weight"])


def write_checkpoint(path, vocab, hidden, heads, kv_heads, head_size, inter, seed=0) -> None:
    """A Hugging Face-named safetensors file for TinyBlock, with random weights."""
    from safetensors.torch import save_file

    p = "model.layers.0."
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        p + "input_layernorm.weight": (hidden,),
        p + "self_attn.q_proj.weight": (heads * head_size, hidden),
        p + "self_attn.q_proj.bias": (heads * head_size,),
        p + "self_attn.k_proj.weight": (kv_heads * head_size, hidden),
        p + "self_attn.k_proj.bias": (kv_heads * head_size,),
        p + "self_attn.v_proj.weight": (kv_heads * head_size, hidden),
        p + "self_attn.v_proj.bias": (kv_heads * head_size,),
        p + "self_attn.o_proj.weight": (hidden, heads * head_size),
        p + "self_attn.o_proj.bias": (hidden,),
        p + "mlp.gate_proj.weight": (inter, hidden),
        p + "mlp.up_proj.weight": (inter, hidden),
        p + "mlp.down_proj.weight": (hidden, inter),
        "lm_head.weight": (vocab, hidden),
        "model.layers.0.self_attn.rotary_emb.inv_freq": (head_size // 2,),  # ignored
    }
    save_file(
        {name: randn(seed + i, *shape) * 0.3 for i, (name, shape) in enumerate(shapes.items())},
        str(path),
    )
