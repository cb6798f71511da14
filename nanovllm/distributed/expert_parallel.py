"""Expert parallelism: each rank holds a slice of a mixture of experts' experts, not of each expert.

A mixture-of-experts layer with E experts has E MLPs' worth of weights, most of a modern model's
parameters. Tensor parallelism would cut every expert's intermediate dimension N ways, leaving
each rank a thin slice of all E experts. Expert parallelism (vLLM's `enable_expert_parallel`)
instead gives each of the N ranks E / N whole experts; a (token, expert) pair is computed on the
rank that holds its expert, with the expert's full matmuls.

Which experts a rank holds (`local_expert_range`): a contiguous run, vLLM's linear placement.
Rank r of N holds experts [r * E // N, (r + 1) * E // N) when N divides E; otherwise the
remainder E % N goes one each to the first ranks (E = 10 on 4 ranks: 3, 3, 2, 2 experts).

How tokens reach their experts and come back depends on where the tokens are:

- Attention tensor-parallel (as here and in vLLM without data parallelism): after attention's
  all-reduce, every rank holds the same hidden states of the same tokens, and the router, run
  redundantly on every rank, picks the same experts everywhere. Dispatch then needs no message:
  each rank *selects* the (token, expert) pairs whose expert it holds. Each rank computes its
  pairs and adds them into a [num_tokens, hidden] partial output that is zero elsewhere, and the
  combine is one all-reduce (sum) of those partials, which leaves every rank with the whole
  output, as the next layer's tensor-parallel attention needs. (This is what vLLM does when
  `enable_expert_parallel` runs beside tensor-parallel attention: the experts' outputs are
  all-reduced, as a row-parallel layer's are.)
- Attention data-parallel (DeepSeek-style serving, vLLM's `data_parallel_size` with expert
  parallelism): each rank holds *different* tokens, so pairs must travel. Either every rank
  all-gathers every rank's tokens, computes its own pairs, and a reduce-scatter returns each
  token's summed output to the rank it came from (vLLM's `allgather_reducescatter` backend:
  every token goes to every rank); or an all-to-all sends each pair only to the rank that holds
  its expert and a second one brings the results back (DeepEP, pplx: at most num_tokens * k
  rows leave a rank, fewer when a token's experts are its own rank's). With many ranks and few
  experts per token, the all-to-all moves far less, which is why large deployments use it.

With tensor-parallel attention both become the scheme above: the all-gather is not needed (every
rank has every token already), and the reduce-scatter becomes an all-reduce (every rank needs
every token's output for the next layer's attention). An all-to-all would gain nothing: every
rank already holds every token, so there is nothing to send, and the all-reduce is the one
collective the layer needs, the same one a tensor-parallel MLP ends with.

`expert_parallel_experts` runs any function shaped like `fused_experts` (the Triton kernel in
`nanovllm.kernels.fused_moe`, its torch reference, or a CPU path) on this rank's pairs. The
pairs are selected with `nonzero`, whose result size depends on the routing: it reads a count
back from the device and cannot be captured in a CUDA graph. (vLLM keeps the shapes fixed
instead: an `expert_map` turns non-local experts into -1, which its kernel skips.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from nanovllm.distributed.communication import tensor_model_parallel_all_reduce
from nanovllm.kernels.fused_moe_reference import fused_experts_ref

# fused_experts(hidden_states, w13, w2, topk_weights, topk_ids) -> [num_tokens, hidden]
ExpertsFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def local_expert_range(num_experts: int, ep_rank: int, ep_size: int) -> range:
    """The global ids of the experts rank `ep_rank` of `ep_size` holds (the first
    num_experts % ep_size ranks hold one more than the others)."""
    if ep_size < 1:
        raise ValueError(f"ep_size must be >= 1, got {ep_size}")
    if not 0 <= ep_rank < ep_size:
        raise ValueError(f"ep_rank {ep_rank} is outside an expert-parallel group of {ep_size}")
    if num_experts < ep_size:
        raise ValueError(
            f"num_experts={num_experts} is fewer than the expert-parallel size {ep_size}: "
            "some rank would hold no expert"
        )
    base, remainder = divmod(num_experts, ep_size)
    first = ep_rank * base + min(ep_rank, remainder)
    return range(first, first + base + (1 if ep_rank < remainder else 0))


def local_expert_weights(weight: torch.Tensor, ep_rank: int, ep_size: int) -> torch.Tensor:
    """The slice of a stacked [num_experts, ...] expert weight (w13, w2) that a rank loads: its
    own experts, in global order (local expert i is global expert first + i)."""
    experts = local_expert_range(weight.shape[0], ep_rank, ep_size)
    return weight[experts.start : experts.stop]


def expert_parallel_experts(
    hidden_states: torch.Tensor,  # [num_tokens, hidden], the same on every rank
    w13: torch.Tensor,  # [num_local_experts, 2 * intermediate, hidden]: this rank's experts
    w2: torch.Tensor,  # [num_local_experts, hidden, intermediate]
    topk_weights: torch.Tensor,  # [num_tokens, k] float32, the same on every rank
    topk_ids: torch.Tensor,  # [num_tokens, k] int: GLOBAL expert ids
    first_expert: int,  # global id of local expert 0 (local_expert_range(...).start)
    group: dist.ProcessGroup | None = None,  # None: the tensor-parallel group
    experts_fn: ExpertsFn = fused_experts_ref,  # or fused_moe.fused_experts, a CPU path
) -> torch.Tensor:  # [num_tokens, hidden], the whole layer's output on every rank
    """Every token's chosen experts, weighted and summed, with the experts spread over ranks.

    This rank computes the (token, expert) pairs whose expert it holds, through `experts_fn`
    with one pair per row (k = 1, local expert ids), adds them into a partial output, and
    all-reduces the partials over `group`. Every rank must call it, even one with no pair.
    """
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2:
        raise ValueError(
            f"topk_ids and topk_weights must both be [num_tokens, k], got "
            f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}"
        )
    num_tokens, hidden = hidden_states.shape
    num_local_experts = w13.shape[0]
    local_ids = topk_ids - first_expert  # [num_tokens, k]; in [0, num_local_experts) if mine
    is_local = (local_ids >= 0) & (local_ids < num_local_experts)
    tokens, choice = is_local.nonzero(as_tuple=True)  # [num_pairs], [num_pairs]

    # This rank's partial output, summed in float32 and rounded once (as a token's k experts
    # are summed by fused_experts); the all-reduce then runs in the model's dtype, as vLLM's.
    out = hidden_states.new_zeros(num_tokens, hidden, dtype=torch.float32)
    if tokens.numel() > 0:
        pair_out = experts_fn(
            hidden_states[tokens],  # [num_pairs, hidden]: a token once per local pair
            w13,
            w2,
            topk_weights[tokens, choice][:, None],  # [num_pairs, 1]
            local_ids[tokens, choice][:, None],  # [num_pairs, 1]
        )  # [num_pairs, hidden], each already times its weight
        # (index_put_, not index_add_: on a CPU index_add_ enters a thread pool, 100x slower
        # on small batches when other processes share the cores)
        out.index_put_((tokens,), pair_out.float(), accumulate=True)
    out = out.to(hidden_states.dtype)
    if group is None:
        return tensor_model_parallel_all_reduce(out)  # no-op when running alone
    if dist.get_world_size(group) > 1:
        dist.all_reduce(out, group=group)
    return out
