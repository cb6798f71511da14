"""Lesson 02 in the real engine: your block count decides how many blocks every request holds,
your slot mapping where every token's K and V go.

`nanovllm lesson 2 --run` builds the engine with a KV cache manager that gives each request
`blocks_needed(its tokens)` blocks (`plug.BlocksNeeded`), and step inputs that cut every block
table to that (`plug.your_slot_mapping`),
and writes every step's new K/V to your `slot_mapping` of their positions (a decode's one new
token to your `slot_for` of its position). Many of the prompts
and outputs end exactly at a block's end (16, 32, 48 tokens), where a count one too high or too
low shows. Besides the completions, the run compares every block handed out and given back
with the stock engine's, step by step: a wrong slot overwrites another token's K/V, a wrong
count takes a block too many (or leaves a token without one).
"""

from __future__ import annotations

import functools

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import BlocksNeeded, your_slot_mapping

ENGINE: dict = {}
WORKLOAD = "batch"
COMPARE = "blocks"
MOMENT = "new_block"  # a decoding request's block fills and it takes a new one


def plug_in(impl) -> EngineParts:
    return EngineParts(
        kv_cache_manager_cls=functools.partial(BlocksNeeded, impl=impl),
        step_inputs=your_slot_mapping(impl),
    )


def swapped(engine) -> list[str]:
    return [
        "blocks per request: your `blocks_needed`",
        "block tables cut by your `blocks_needed`",
        "every slot by your `slot_mapping` (a decode's by your `slot_for`)",
    ]
