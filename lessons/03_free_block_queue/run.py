"""Lesson 03 in the real engine: your FreeBlockQueue hands out and takes back every KV block.

`nanovllm lesson 3 --run` builds the engine with your free block queue over the KV cache's blocks
(the part `free_block_queue`). Prefix caching is on and requests arrive in waves that
start alike, so freed blocks keep their cached prefixes and later requests pull them back out
of the middle of your queue (`remove`). Besides the completions, the run compares, step by
step, every block handed out, given back and hit, and how many free blocks your queue counts
(the engine admits a request only when the count says its blocks are there), with the stock
engine's: LRU order decides which cached prefix is evicted first. Once every request is done,
both queues are handed a double free and asked for a block they do not hold
(`misuse_free_block_queue`): the engine never does either, but a bug could, and the stock queue
refuses both.
"""

from __future__ import annotations

from nanovllm.core.free_block_queue import FreeBlockQueue
from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import (
    KeptPart,
    built_part,
    misuse_free_block_queue,
    your_free_block_queue,
)

ENGINE = dict(enable_prefix_caching=True, num_kv_blocks=48)
WORKLOAD = "waves"
COMPARE = "blocks"
MOMENT = "hit_from_the_middle"  # a new request pulls a cached block out of the middle
AFTER_SERVING = "what the queue does with a double free and with a block it does not hold"


def plug_in(impl) -> EngineParts:
    return EngineParts(free_block_queue=your_free_block_queue(impl.FreeBlockQueue))


def stock_parts() -> EngineParts:
    """The stock engine's parts: its own queue, kept for `after_serving`."""
    return EngineParts(free_block_queue=KeptPart(FreeBlockQueue))


def swapped(engine) -> list[str]:
    return ["the free block queue: your `FreeBlockQueue`"]


def after_serving(engine) -> list[str]:
    (queue,) = built_part(engine, "free_block_queue")
    return misuse_free_block_queue(queue)
