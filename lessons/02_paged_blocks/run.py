"""Lesson 02 in the real engine: your slot mapping decides where every token's K and V go.

`nanovllm lesson 2 --run` wraps the model runner's `prepare_inputs`: each step, every request's
block table is cut to `blocks_needed(tokens after the step)` blocks, and the step's slot mapping
(where `store_kv` writes each new token's K/V) is your `slot_mapping` of its new positions. A
wrong slot overwrites another token's K/V, or one of another request's: the completions show it.
"""

from __future__ import annotations

from nanovllm.lessons.plug import swap_slot_mapping

ENGINE: dict = {}
WORKLOAD = "batch"
COMPARE = None
MOMENT = "new_block"  # a decoding request's block fills and it takes a new one


def plug_in(engine, impl) -> list[str]:
    swap_slot_mapping(engine, impl)
    return ["block tables cut by your `blocks_needed`", "every slot by your `slot_mapping`"]
