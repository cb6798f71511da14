"""Lesson 17 exercise: the router's choice, and the token dispatch that sends each token to it.

A mixture-of-experts layer holds E small MLPs, the experts, and a router that scores every
expert for every token (`router_logits`, a linear layer the model gives you). Each token goes
through only its k best-scored experts, and the layer's output is their outputs weighted by the
router's probabilities. You write the router's rule (`select_experts`) and the dispatch: sorting
the tokens by expert so that each expert runs once over all of its tokens (`sort_by_expert`),
and the layer itself, gathering each expert's tokens and adding its weighted outputs back into
their rows (`fused_experts`). Check with `nanovllm lesson 17 --check`.

The experts' weights are stacked, every expert in one tensor (vLLM's `FusedMoE` layout):

    w13_weight   [E, 2 * I, H]   expert e's gate rows (I of them), then its up rows
    w2_weight    [E, H, I]       expert e's down projection

and `expert_mlp(x, w13_weight[e], w2_weight[e])` (the engine's, imported below) runs expert e
on rows x [m, H]: the experts themselves are not this lesson's subject.
"""

from __future__ import annotations

import torch

from nanovllm.models.moe import expert_mlp  # noqa: F401 (one expert, for your fused_experts)


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's choice for each token: which `top_k` experts, and with what weight.

    router_logits [num_tokens, num_experts] (float32 or bfloat16). Take a softmax over all the
    experts, in float32 whatever the logits' dtype; keep each token's `top_k` most probable
    experts; with `renormalize` (Mixtral always, Qwen3-MoE with `norm_topk_prob`) divide their
    probabilities by their sum, so each token's weights sum to 1, else keep them as they are.

    Returns (topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int64),
    each token's experts in decreasing weight. Do not modify `router_logits`.
    """
    raise NotImplementedError("write select_experts (lesson 17)")


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The dispatch's order: every (token, slot) pair, sorted by its expert.

    topk_ids [num_tokens, top_k] (int64 or int32). Pair p is token p // top_k's slot p % top_k
    (the pairs of `topk_ids.flatten()`), and its expert is `topk_ids.flatten()[p]`. Returns

        order   [num_tokens * top_k] int64: the pair indices, expert 0's pairs first, then
                expert 1's, ...; within one expert, in increasing pair index (token order)
        counts  [num_experts] int64: how many pairs each expert has (0 for an expert no token
                chose, the last experts included)
    """
    raise NotImplementedError("write sort_by_expert (lesson 17)")


def fused_experts(
    hidden_states: torch.Tensor,
    w13_weight: torch.Tensor,
    w2_weight: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """The layer: each token through its experts, their outputs weighted and summed.

    hidden_states [num_tokens, H]; w13_weight [E, 2 * I, H] and w2_weight [E, H, I] (see the
    module docstring); topk_weights and topk_ids [num_tokens, top_k] (what `select_experts`
    returns; any weights, not only ones that sum to 1). Returns out [num_tokens, H], of
    hidden_states' dtype; with x = hidden_states:

        out[t] = sum over j < top_k of  topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])

    Run each expert once, on all of its tokens together: sort the pairs by expert with your
    `sort_by_expert`, and for each expert with pairs, gather its tokens' rows, run
    `expert_mlp(rows, w13_weight[e], w2_weight[e])`, and add each result row, times its pair's
    weight, into its token's row of `out`. Do not modify the inputs.
    """
    raise NotImplementedError("write fused_experts (lesson 17)")
