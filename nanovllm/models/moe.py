"""Mixture of experts: a router sends each token to k of E small MLPs, and only those run.

A dense transformer runs every token through one MLP. A mixture-of-experts (MoE) layer holds E
MLPs, the experts, and a router: a linear layer that scores every expert for every token. Each
token goes through only its k best-scored experts (2 of 8 in Mixtral, 8 of 128 in Qwen3-MoE),
and the layer's output is their outputs weighted by the router's scores. So the model holds E
MLPs' worth of parameters, but a token costs only k MLPs' arithmetic: Mixtral-8x7B holds 47B
parameters and computes, per token, like a 13B model.

For a flat batch of n tokens (hidden size H, each expert's intermediate size I):

    x [n, H] --router--> router_logits [n, E]
             --select_experts--> topk_ids [n, k] (which experts), topk_weights [n, k] (how much)
             --fused_experts--> for each expert e, the rows of x routed to it, x_e [n_e, H]:
                 y_e = (silu(x_e w1_e^T) * (x_e w3_e^T)) w2_e^T                      [n_e, H]
                 out[token] += weight * y_e[row]                                  out [n, H]

`select_experts` is each model's routing rule: both take a softmax over all E logits and keep
the k largest; Mixtral renormalises the k so they sum to 1, Qwen3-MoE only with `norm_topk_prob`.
(A softmax over only the k chosen logits is the same as renormalising: Mixtral's paper says it
that way.)

`fused_experts` groups the tokens by expert (`sort_by_expert` sorts the n * k (token, expert)
pairs by expert), so each expert runs one matmul over all of its tokens rather than one per
token, and then adds each result, weighted, into its token's row. vLLM's `fused_moe` does the same grouping in one
Triton kernel; the CPU backend has its own (`backends/cpu_moe.py`).

The weights are vLLM's `FusedMoE` layout, every expert stacked in one tensor:

    w13_weight   [E, 2 * I, H]   each expert's gate (w1) rows, then its up (w3) rows
    w2_weight    [E, H, I]       each expert's down projection
    gate.weight  [E, H]          the router (Hugging Face's name)

A checkpoint stores each expert's matrices as tensors of their own (Qwen3-MoE's
`model.layers.0.mlp.experts.3.gate_proj.weight`, Mixtral's
`model.layers.0.block_sparse_moe.experts.3.w1.weight`): `expert_target` names the stacked
parameter and the slot that each one loads into.

With tensor parallelism every rank holds every expert, but only its 1/tp slice of each one's
intermediate dimension (gate/up cut by rows, down by columns, as the dense MLP's column- and
row-parallel layers are); each rank's output is a partial sum, and an all-reduce adds them up.
The router is replicated: every rank routes every token alike.

Each layer keeps `expert_load`, the number of tokens each of its experts received in its last
forward pass: where the work went, and how unevenly.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.distributed.communication import tensor_model_parallel_all_reduce
from nanovllm.distributed.parallel_state import get_tp_rank, get_tp_world_size
from nanovllm.models.linear import LoadedWeight, check_shape, divide, new_parameter
from nanovllm.models.model_args import ModelArgs


def select_experts(
    router_logits: torch.Tensor,  # [num_tokens, num_experts]
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's choice: softmax over all experts, the `top_k` most probable, and (with
    `renormalize`) their probabilities rescaled to sum to 1.

    Returns topk_weights [num_tokens, top_k] (float32) and topk_ids [num_tokens, top_k] (int64),
    each row's experts in decreasing weight.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)  # [n, E], in float32 as HF's routers
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)  # [n, k] each
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def expert_mlp(
    x: torch.Tensor,  # [m, hidden]
    w13: torch.Tensor,  # [2 * intermediate, hidden]: gate rows, then up rows
    w2: torch.Tensor,  # [hidden, intermediate]
) -> torch.Tensor:  # [m, hidden]
    """One expert, a SwiGLU MLP as Llama's: (silu(x w1^T) * (x w3^T)) w2^T."""
    gate, up = F.linear(x, w13).chunk(2, dim=-1)  # [m, intermediate] each
    return F.linear(F.silu(gate) * up, w2)


def sort_by_expert(
    topk_ids: torch.Tensor,  # [num_tokens, top_k]
    num_experts: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token dispatch's order: the n * k (token, slot) pairs sorted by expert, pair p being
    token p // top_k's slot p % top_k. Returns order [n * k] (int64: the pairs of expert 0 in
    token order, then expert 1's, ...) and counts [num_experts] (int64: each expert's pairs)."""
    pair_ids = topk_ids.flatten()  # [n * k]: each pair's expert
    order = torch.argsort(pair_ids, stable=True)  # [n * k]
    counts = torch.bincount(pair_ids, minlength=num_experts)  # [E]
    return order, counts


def fused_experts(
    hidden_states: torch.Tensor,  # [num_tokens, hidden]
    w13_weight: torch.Tensor,  # [num_experts, 2 * intermediate, hidden]
    w2_weight: torch.Tensor,  # [num_experts, hidden, intermediate]
    topk_weights: torch.Tensor,  # [num_tokens, top_k]
    topk_ids: torch.Tensor,  # [num_tokens, top_k]
) -> torch.Tensor:  # [num_tokens, hidden]
    """Each token through its top-k experts (SiLU-gated MLPs), their outputs summed with the
    router's weights: the tokens grouped by expert, one matmul per expert."""
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros_like(hidden_states)
    # The n * k (token, slot) pairs, sorted by expert: each expert's pairs are then a run.
    order, counts = sort_by_expert(topk_ids, w13_weight.shape[0])  # [n * k], [E]
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        pairs = order[start : start + count]  # [n_e]
        start += count
        tokens = pairs // top_k  # [n_e]: distinct (a token picks an expert once)
        y = expert_mlp(hidden_states[tokens], w13_weight[expert], w2_weight[expert])  # [n_e, H]
        weights = topk_weights.flatten()[pairs].unsqueeze(1)  # [n_e, 1]
        out.index_add_(0, tokens, (y * weights).to(out.dtype))
    return out


# A checkpoint's per-expert tensor: Mixtral's w1/w3/w2, Qwen3-MoE's gate/up/down_proj.
_EXPERT_TENSOR = re.compile(
    r"^(.*)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)"
    r"\.weight$"
)
# Hugging Face's name of each expert matrix -> its shard in the stacked weights (vLLM's names).
_SHARD = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "w1": "w1", "w3": "w3", "w2": "w2"}


def expert_target(name: str) -> tuple[str, tuple[int, str] | None] | None:
    """Where a checkpoint tensor of a mixture-of-experts layer loads: (the parameter's name, the
    shard id its `weight_loader` takes: (expert, "w1" | "w2" | "w3"), or None for the router).
    None for any other tensor. Mixtral's `block_sparse_moe` is the layer's `mlp` here."""
    match = _EXPERT_TENSOR.match(name)
    if match is not None:
        prefix, expert, matrix = match.groups()
        stacked = "w2_weight" if _SHARD[matrix] == "w2" else "w13_weight"
        return f"{prefix}.mlp.experts.{stacked}", (int(expert), _SHARD[matrix])
    if ".block_sparse_moe.gate." in name:
        return name.replace(".block_sparse_moe.", ".mlp."), None
    return None


class FusedMoE(nn.Module):
    """The experts of one layer, stacked (vLLM's `FusedMoE`): routes the tokens by the router's
    logits (`select_experts`), runs them through their experts (`apply`), and sums the ranks'
    partial results. x [num_tokens, hidden] -> [num_tokens, hidden]."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        # The experts this rank holds, and which run of each one's intermediate dimension.
        self.local_experts, self.intermediate_start, n = self.partition()
        self.intermediate_size_per_partition = n
        num_local = len(self.local_experts)
        self.w13_weight = new_parameter(
            num_local, 2 * n, hidden_size, dtype=params_dtype, weight_loader=self.weight_loader
        )
        self.w2_weight = new_parameter(
            num_local, hidden_size, n, dtype=params_dtype, weight_loader=self.weight_loader
        )
        # The checkpoint tensors each parameter is loaded from (the loader checks none is missing).
        self.w13_weight.shard_ids = [(e, w) for e in self.local_experts for w in ("w1", "w3")]
        self.w2_weight.shard_ids = [(e, "w2") for e in self.local_experts]
        # Tokens routed to each expert in the last forward pass.
        self.expert_load = torch.zeros(num_experts, dtype=torch.int64)

    def partition(self) -> tuple[range, int, int]:
        """(the experts this rank holds, where its run of each one's intermediate dimension
        starts, its length): under tensor parallelism every expert, 1/tp of each."""
        n = divide(self.intermediate_size, self.tp_size, "moe_intermediate_size")
        return range(self.num_experts), self.tp_rank * n, n

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: tuple[int, str]
    ) -> None:
        """Copy this rank's run of one expert's full matrix into its place: `shard_id` is
        (expert, "w1" | "w3" | "w2"): w1 (gate) [I, H] and w3 (up) [I, H] to rows [0, n) and
        [n, 2n) of `w13_weight[expert]`, w2 (down) [H, I] to `w2_weight[expert]`, by columns.
        Another rank's expert is skipped."""
        expert, matrix = shard_id
        if not 0 <= expert < self.num_experts or matrix not in ("w1", "w2", "w3"):
            raise ValueError(
                f"FusedMoE: shard {shard_id!r} is not (expert in 0..{self.num_experts - 1}, "
                "'w1' | 'w2' | 'w3')"
            )
        if expert not in self.local_experts:
            return
        local = expert - self.local_experts.start
        n, full, start = (
            self.intermediate_size_per_partition,
            self.intermediate_size,
            self.intermediate_start,
        )
        if matrix == "w2":
            check_shape(f"FusedMoE expert {expert} w2", loaded_weight, (self.hidden_size, full))
            param.data[local].copy_(loaded_weight.narrow(1, start, n))
            return
        check_shape(f"FusedMoE expert {expert} {matrix}", loaded_weight, (full, self.hidden_size))
        rows = param.data[local].narrow(0, 0 if matrix == "w1" else n, n)
        rows.copy_(loaded_weight.narrow(0, start, n))

    def forward(
        self,
        hidden_states: torch.Tensor,  # [num_tokens, hidden]
        router_logits: torch.Tensor,  # [num_tokens, num_experts]
    ) -> torch.Tensor:  # [num_tokens, hidden]
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        self.expert_load = torch.bincount(topk_ids.flatten(), minlength=self.num_experts)
        out = self.apply(hidden_states, topk_weights, topk_ids)
        if self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)  # every rank's slice of every expert
        return out

    def apply(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """The experts' computation (a backend's subclass gives a faster one)."""
        return fused_experts(hidden_states, self.w13_weight, self.w2_weight, topk_weights, topk_ids)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, "
            f"intermediate={self.intermediate_size}, tp_size={self.tp_size}, "
            f"renormalize={self.renormalize}"
        )


class Router(nn.Module):
    """The router: one score per expert for each token, x [num_tokens, hidden] ->
    router_logits [num_tokens, num_experts]. Whole on every rank (vLLM's `ReplicatedLinear`)."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class SparseMoeBlock(nn.Module):
    """A decoder layer's MLP as a mixture of experts: the router, then the experts (vLLM's
    `Qwen3MoeSparseMoeBlock`, `MixtralMoE`). Built by `ModelLayers.moe` on sparse layers."""

    fused_moe_class: type[FusedMoE] = FusedMoE

    def __init__(self, args: ModelArgs, layers=None) -> None:
        super().__init__()
        self.gate = Router(args.hidden_size, args.num_experts)
        self.experts = self.fused_moe_class(
            args.num_experts,
            args.num_experts_per_tok,
            args.hidden_size,
            args.moe_intermediate_size,
            renormalize=args.norm_topk_prob,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))  # x [num_tokens, hidden] -> [num_tokens, hidden]


def expert_loads(model: nn.Module) -> dict[int, torch.Tensor]:
    """Per sparse decoder layer (by index), the tokens each expert received in the last forward
    pass: {layer: [num_experts]}."""
    return {
        i: layer.mlp.experts.expert_load
        for i, layer in enumerate(model.model.layers)
        if isinstance(layer.mlp, SparseMoeBlock)
    }
