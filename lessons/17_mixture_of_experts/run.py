"""Lesson 17 in the real engine: your router and your token dispatch in every sparse layer.

`nanovllm lesson 17 --run` builds both engines on the demo model as a mixture of experts
(`demo_support.moe_model_path`: Mixtral, each layer's MLP cut into 4 experts, a router choosing
2 per token), and in yours every layer's experts route with your `select_experts` and run with
your `fused_experts` and `sort_by_expert` (the part `model_layers`, given when your engine is
built: `lessons/plug_moe.py` shows how). The 64 greedy completions of the `batch` workload must
come out token for token as the stock engine's: a wrong expert, weight or row changes the
hidden states of every layer above it.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.demo_support import moe_model_path
from nanovllm.lessons.plug import LessonRunError
from nanovllm.lessons.plug_moe import YourMoeLayers, your_moe_layers

ENGINE: dict = {}
WORKLOAD = "batch"
COMPARE = None  # the completions: the routing is inside each step's forward pass
MOMENT = "busiest_step"


def model():
    """The checkpoint both engines run: the demo model cut into experts."""
    return moe_model_path()


def plug_in(impl) -> EngineParts:
    return EngineParts(model_layers=your_moe_layers(impl))


def swapped(engine) -> list[str]:
    part = engine.config.parts.model_layers if engine.config.parts is not None else None
    if not isinstance(part, YourMoeLayers) or part.num_layers == 0:
        raise LessonRunError("the engine was built without your mixture-of-experts layers")
    return [
        f"the mixture of experts of each of {part.num_layers} layers: your `select_experts` "
        "(which experts, and their weights), `sort_by_expert` and `fused_experts` (each expert "
        "once over its tokens, the results weighted back into their rows)"
    ]
