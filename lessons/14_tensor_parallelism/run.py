"""Lesson 14 in the real engine: your cuts and your combinations, on two ranks in two processes.

`nanovllm lesson 14 --run` builds both engines with `tensor_parallel_size=2`: rank 0 in this
process, rank 1 in a worker process, joined by torch.distributed (gloo). Yours is built with your layers (the part
`model_layers`, which the engine carries to every rank's process): every rank loads its weights through your `column_shard`, `row_shard` and `heads_of_rank`, and puts the
ranks' partial results together with your `gather_columns` and `reduce_rows`
(`lessons/plug_tensor_parallel.py` shows how). The 64 greedy completions must come out token
for token as the stock engine's.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.demo_support import demo_model_path
from nanovllm.lessons.plug import LessonRunError
from nanovllm.lessons.plug_tensor_parallel import is_yours, your_model_layers

TENSOR_PARALLEL_SIZE = 2
ENGINE = dict(tensor_parallel_size=TENSOR_PARALLEL_SIZE)
WORKLOAD = "batch"
COMPARE = None  # the completions: the ranks' work is inside each step
MOMENT = "busiest_step"


def plug_in(impl) -> EngineParts:
    """The engine's parts, with every rank's model built from your layers."""
    return EngineParts(
        model_layers=your_model_layers(impl, demo_model_path(), TENSOR_PARALLEL_SIZE)
    )


def swapped(engine) -> list[str]:
    if not is_yours(engine):
        raise LessonRunError("the engine was built without your layers")
    return [
        f"the weights of each of {TENSOR_PARALLEL_SIZE} ranks: your `column_shard` (gate, up, "
        "the embedding and LM head), `row_shard` (o_proj, down_proj), `heads_of_rank` (q, k, v)",
        "the ranks' partial results put together: your `reduce_rows` (o_proj, down_proj, the "
        "embedding) and `gather_columns` (the logits)",
    ]
