"""Lesson 17's `--run`: the learner's router and token dispatch as the model's mixture of experts.

The decoder builds each sparse layer's MLP from the class `ModelLayers.moe` it is given
(`nanovllm/models/model_layers.py`), and the engine gets its `ModelLayers` from its part
`model_layers` (`nanovllm/engine/parts.py`). `your_moe_layers(impl)` is such a part: the
engine's own layers, except that every mixture of experts is a `SparseMoeBlock` whose experts
route with the learner's `select_experts` and run with the learner's `fused_experts` (which
sorts with the learner's `sort_by_expert`); the layer's `expert_load`, the tokens each expert
received, is the learner's `sort_by_expert`'s counts. The router's linear layer and the
experts' weights, loaded from the checkpoint, are the engine's.

Each answer is checked before the model uses it: a router's choice of the wrong shape or of an
expert the layer does not have, or an output of the wrong shape, is a `LessonRunError` that
names the function and what it gave. One rank only: lesson 14's `--run` is the tensor-parallel
one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from nanovllm.lessons.plug import LessonRunError
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.moe import FusedMoE, SparseMoeBlock


def _check(what: str, got: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """`got` if it is a tensor of `shape`; LessonRunError naming `what` otherwise."""
    got_shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    if got_shape != shape:
        raise LessonRunError(f"your {what} has shape {got_shape}; the engine needs {shape}")
    return got


def your_moe_block(impl: Any, counter: YourMoeLayers) -> type[SparseMoeBlock]:
    """`SparseMoeBlock` whose experts (a `FusedMoE`) route with `impl.select_experts`, count
    with `impl.sort_by_expert` and run `impl.fused_experts`; `counter.num_layers` counts them."""

    class YourFusedMoE(FusedMoE):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if self.tp_size > 1:
                raise LessonRunError("lesson 17's --run builds one rank, not tensor parallelism")
            counter.num_layers += 1

        def forward(
            self,
            hidden_states: torch.Tensor,  # [num_tokens, hidden]
            router_logits: torch.Tensor,  # [num_tokens, num_experts]
        ) -> torch.Tensor:  # [num_tokens, hidden]
            n, k, e = hidden_states.shape[0], self.top_k, self.num_experts
            choice = impl.select_experts(router_logits, k, self.renormalize)
            if not (isinstance(choice, tuple) and len(choice) == 2):
                raise LessonRunError(
                    "your select_experts must return (topk_weights, topk_ids); it returned "
                    f"{type(choice).__name__}"
                )
            weights = _check("select_experts' topk_weights", choice[0], (n, k))
            ids = _check("select_experts' topk_ids", choice[1], (n, k))
            if ids.is_floating_point() or (n and not 0 <= int(ids.min()) <= int(ids.max()) < e):
                raise LessonRunError(
                    f"your select_experts chose experts {ids.tolist()}: the layer has experts "
                    f"0..{e - 1}, named by integers"
                )
            # The layer's expert_load (what the visualizer shows) is your dispatch's counts.
            order, counts = impl.sort_by_expert(ids, e)
            _check("sort_by_expert's order", order, (n * k,))
            counts = _check("sort_by_expert's counts", counts, (e,))
            if int(counts.sum()) != n * k:
                raise LessonRunError(
                    f"your sort_by_expert's counts {counts.tolist()} add up to "
                    f"{int(counts.sum())}; {n} tokens with {k} experts each are {n * k} pairs"
                )
            self.expert_load = counts
            out = impl.fused_experts(hidden_states, self.w13_weight, self.w2_weight, weights, ids)
            return _check("fused_experts' output", out, tuple(hidden_states.shape))

    class YourSparseMoeBlock(SparseMoeBlock):
        fused_moe_class = YourFusedMoE

    return YourSparseMoeBlock


class YourMoeLayers:
    """The engine's part `model_layers`: its own layers, the mixtures of experts the learner's
    (see the module docstring). `num_layers` counts the sparse layers built with them."""

    def __init__(self, impl: Any) -> None:
        self.num_layers = 0
        self.moe = your_moe_block(impl, self)

    def __call__(self, attention: type) -> ModelLayers:
        return dataclasses.replace(ModelLayers(attention), moe=self.moe)


def your_moe_layers(impl: Any) -> YourMoeLayers:
    """The part `model_layers` whose mixtures of experts are `impl`'s."""
    return YourMoeLayers(impl)
