"""The mixture-of-experts layer (`nanovllm/models/moe.py`) and its CPU fast path, against oracles.

The oracles are independent of the layer: the routing written out in float64 Python (a softmax,
the k largest by sorting, each model's renormalisation), and a dense computation of the layer
that runs *every* expert on *every* token from Hugging Face's separate gate/up/down matrices and
weights each by a one-hot of the routing. Properties: every token reaches exactly its top-k
experts and is weighted by the router's weights; the loader puts each checkpoint tensor in its
expert's place (Mixtral's and Qwen3-MoE's names); two tensor-parallel ranks' partial results
add up to the whole layer; which layers are sparse follows transformers' own rule; the CPU fast
path equals the plain layer.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.backends.cpu_moe import cpu_fused_experts
from nanovllm.distributed.parallel_state import as_tp_rank
from nanovllm.models.model_args import ModelArgs
from nanovllm.models.moe import FusedMoE, SparseMoeBlock, fused_experts, select_experts
from nanovllm.models.sharded_loader import load_tensors

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def oracle_route(logits: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
    """The routing as a dense [num_tokens, num_experts] float64 matrix: a token's weight on
    each of its top-k experts (softmax over all experts, then renormalised or not), 0 elsewhere."""
    combine = torch.zeros(logits.shape, dtype=torch.float64)
    for t, row in enumerate(logits.double().tolist()):
        top = max(row)
        exps = [math.exp(v - top) for v in row]
        probs = [e / sum(exps) for e in exps]
        chosen = sorted(range(len(row)), key=lambda e: -probs[e])[:top_k]
        total = sum(probs[e] for e in chosen) if renormalize else 1.0
        for e in chosen:
            combine[t, e] = probs[e] / total
    return combine


def dense_oracle(x, w1, w3, w2, combine) -> torch.Tensor:
    """Every expert on every token (gate w1, up w3, down w2: Hugging Face's separate matrices),
    summed with the routing's weights: [num_tokens, hidden] in float64."""
    x = x.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for e in range(w1.shape[0]):
        y = F.linear(F.silu(x @ w1[e].double().T) * (x @ w3[e].double().T), w2[e].double())
        out += combine[:, e : e + 1] * y
    return out


def random_layer(seed: int, num_tokens: int, num_experts: int, hidden: int, inter: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g)
    gate = torch.randn(num_experts, hidden, generator=g)  # the router: logits of a few units
    w1, w3 = (torch.randn(num_experts, inter, hidden, generator=g) / hidden**0.5 for _ in "13")
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    return x, gate, w1, w3, w2


def layer_of(case: dict):
    return random_layer(
        case["seed"], case["num_tokens"], case["num_experts"], case["hidden"], case["inter"]
    )


layer_shapes = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31),
        "num_tokens": st.integers(1, 12),
        "num_experts": st.integers(2, 8),
        "hidden": st.sampled_from([8, 16]),
        "inter": st.sampled_from([4, 12]),
    }
).flatmap(
    lambda s: st.fixed_dictionaries(
        {"top_k": st.integers(1, min(3, s["num_experts"])), "renormalize": st.booleans()}
    ).map(lambda r: {**s, **r})
)


@settings(max_examples=examples(40), deadline=None)
@given(case=layer_shapes)
def test_the_router_picks_the_top_k_with_the_models_weights(case) -> None:
    x, gate, *_ = layer_of(case)
    logits = x @ gate.T
    weights, ids = select_experts(logits, case["top_k"], case["renormalize"])
    assert weights.shape == ids.shape == (case["num_tokens"], case["top_k"])
    combine = oracle_route(logits, case["top_k"], case["renormalize"])
    got = torch.zeros_like(combine).scatter_(1, ids, weights.double())
    assert [set(r.nonzero().flatten().tolist()) for r in got] == [
        set(r.nonzero().flatten().tolist()) for r in combine
    ]
    torch.testing.assert_close(got, combine, rtol=1e-5, atol=1e-6)


@settings(max_examples=examples(40), deadline=None)
@given(case=layer_shapes)
def test_the_layer_equals_every_expert_weighted_by_a_one_hot_of_the_routing(case) -> None:
    """Plain layer and CPU fast path (with and without torch's grouped matmul) against the
    dense oracle; the layer's per-expert token counts against the routing's."""
    x, gate, w1, w3, w2 = layer_of(case)
    logits = x @ gate.T
    combine = oracle_route(logits, case["top_k"], case["renormalize"])
    expected = dense_oracle(x, w1, w3, w2, combine).float()
    w13 = torch.cat([w1, w3], dim=1)  # [E, 2I, H]: gate rows, then up rows
    weights, ids = select_experts(logits, case["top_k"], case["renormalize"])
    plain = fused_experts(x, w13, w2, weights, ids)
    torch.testing.assert_close(plain, expected, rtol=1e-4, atol=1e-5)
    for grouped in (None, True, False):
        fast = cpu_fused_experts(x, w13, w2, weights, ids, use_grouped_mm=grouped)
        torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6)
    args = moe_args(case["num_experts"], case["top_k"], case["hidden"], case["inter"],
                    case["renormalize"])  # fmt: skip
    layer = SparseMoeBlock(args)
    layer.gate.weight.copy_(gate)
    layer.experts.w13_weight.copy_(w13)
    layer.experts.w2_weight.copy_(w2)
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-5)
    assert layer.experts.expert_load.tolist() == (combine > 0).sum(0).tolist()


@settings(max_examples=examples(20), deadline=None)
@given(case=layer_shapes)
def test_each_token_reaches_exactly_its_top_k_experts_with_the_routers_weights(case) -> None:
    """Expert e writes only output coordinate e (its down projection's other rows are 0), so
    a token's output says which experts it reached and with what weight."""
    num_experts, hidden = case["num_experts"], case["hidden"]
    x, gate, w1, w3, w2 = layer_of(case)
    mask = torch.zeros(num_experts, hidden, 1)
    mask[torch.arange(num_experts), torch.arange(num_experts)] = 1.0
    w2 = w2 * mask  # expert e's output: [0, ..., y_e, ..., 0]
    logits = x @ gate.T
    weights, ids = select_experts(logits, case["top_k"], case["renormalize"])
    out = fused_experts(x, torch.cat([w1, w3], dim=1), w2, weights, ids)[:, :num_experts]
    combine = oracle_route(logits, case["top_k"], case["renormalize"])
    assert ((out != 0) == (combine > 0)).all(), "a token reached an expert it was not routed to"
    each = dense_oracle(x, w1, w3, w2, torch.ones(logits.shape, dtype=torch.float64))
    torch.testing.assert_close(out.double(), combine * each[:, :num_experts], rtol=1e-4, atol=1e-6)


def moe_args(num_experts: int, top_k: int, hidden: int, inter: int, renormalize: bool):
    return ModelArgs(
        architecture="Qwen3MoeForCausalLM", vocab_size=8, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=hidden, rms_norm_eps=1e-6, max_position_embeddings=8,
        rope_parameters={}, tie_word_embeddings=False, qkv_bias=False, o_bias=False,
        mlp_bias=False, qk_norm=False, num_experts=num_experts, num_experts_per_tok=top_k,
        moe_intermediate_size=inter, norm_topk_prob=renormalize,
    )  # fmt: skip


class OneLayer(torch.nn.Module):
    """One sparse block at a decoder layer's place, so checkpoint names resolve."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.model.layers[0].mlp = SparseMoeBlock(args)


# Checkpoint names of an expert's gate, up and down matrices, and of the router.
NAMES = {
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
}


def checkpoint(style: str, gate, w1, w3, w2) -> list[tuple[str, torch.Tensor, str]]:
    block, g, u, d = NAMES[style]
    prefix = f"model.layers.0.{block}"
    tensors = [(f"{prefix}.gate.weight", gate)]
    for e in range(w1.shape[0]):
        for name, w in ((g, w1), (u, w3), (d, w2)):
            tensors.append((f"{prefix}.experts.{e}.{name}.weight", w[e]))
    return [(name, t, "in the test") for name, t in tensors]


@pytest.mark.parametrize("style", list(NAMES))
def test_the_loader_puts_each_experts_checkpoint_tensors_in_place(style) -> None:
    x, gate, w1, w3, w2 = random_layer(seed=3, num_tokens=9, num_experts=4, hidden=16, inter=12)
    model = OneLayer(moe_args(4, 2, 16, 12, renormalize=style == "mixtral"))
    assert load_tensors(model, checkpoint(style, gate, w1, w3, w2)) == 1 + 3 * 4
    combine = oracle_route(x @ gate.T, 2, renormalize=style == "mixtral")
    expected = dense_oracle(x, w1, w3, w2, combine).float()
    torch.testing.assert_close(model.model.layers[0].mlp(x), expected, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_without_one_experts_matrix_is_refused_by_name() -> None:
    _, gate, w1, w3, w2 = random_layer(seed=4, num_tokens=1, num_experts=4, hidden=16, inter=12)
    tensors = [t for t in checkpoint("qwen3_moe", gate, w1, w3, w2) if "experts.2.up" not in t[0]]
    with pytest.raises(ValueError, match=r"w13_weight \(shard \(2, 'w3'\)\)"):
        load_tensors(OneLayer(moe_args(4, 2, 16, 12, True)), tensors)


def test_two_tensor_parallel_ranks_add_up_to_the_whole_layer() -> None:
    """Each rank holds half of every expert's intermediate features; their partial outputs
    (before the all-reduce) sum to the unsharded layer's."""
    x, gate, w1, w3, w2 = random_layer(seed=5, num_tokens=7, num_experts=4, hidden=16, inter=12)
    weights, ids = select_experts(x @ gate.T, 2, True)
    partials = []
    for rank in (0, 1):
        with as_tp_rank(rank, 2):
            experts = FusedMoE(4, 2, 16, 12, renormalize=True)
        for e in range(4):
            experts.weight_loader(experts.w13_weight, w1[e], (e, "w1"))
            experts.weight_loader(experts.w13_weight, w3[e], (e, "w3"))
            experts.weight_loader(experts.w2_weight, w2[e], (e, "w2"))
        assert experts.w13_weight.shape == (4, 12, 16) and experts.w2_weight.shape == (4, 16, 6)
        partials.append(experts.apply(x, weights, ids))
    whole = fused_experts(x, torch.cat([w1, w3], dim=1), w2, weights, ids)
    torch.testing.assert_close(partials[0] + partials[1], whole, rtol=1e-5, atol=1e-6)


def test_sparse_layers_follow_transformers_rule() -> None:
    """Qwen3-MoE's `mlp_only_layers` and `decoder_sparse_step`: the layers transformers builds
    with experts are the layers built with `num_experts` here."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe import modeling_qwen3_moe as hf

    for step, only in ((1, [2]), (2, []), (3, [5])):
        config = Qwen3MoeConfig(
            vocab_size=16, hidden_size=8, intermediate_size=8, moe_intermediate_size=4,
            num_hidden_layers=6, num_attention_heads=1, num_key_value_heads=1, num_experts=2,
            num_experts_per_tok=1, decoder_sparse_step=step, mlp_only_layers=only,
        )  # fmt: skip
        layers = [hf.Qwen3MoeDecoderLayer(config, i) for i in range(6)]
        sparse = [isinstance(layer.mlp, hf.Qwen3MoeSparseMoeBlock) for layer in layers]
        args = ModelArgs.from_config({**config.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]})
        assert [args.for_layer(i).num_experts > 0 for i in range(6)] == sparse, (step, only)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok=5"),
        ({"num_local_experts": 0}, "num_experts=0"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_a_bad_mixture_is_refused_by_name(fields, message) -> None:
    config = {
        "architectures": ["MixtralForCausalLM"], "vocab_size": 8, "hidden_size": 8,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
        "num_local_experts": 4, "num_experts_per_tok": 2, **fields,
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        ModelArgs.from_config(config)
