"""Lesson 03 in the real engine: your FreeBlockQueue hands out and takes back every KV block.

`nanovllm lesson 3 --run` replaces the KV cache manager's free block queue with yours, over the
same blocks, before the first request. Prefix caching is on and requests arrive in waves that
start alike, so freed blocks keep their cached prefixes and later requests pull them back out
of the middle of your queue (`remove`). Besides the completions, the run compares every block
handed out, freed and hit with the stock engine's: LRU order decides which cached prefix is
evicted first.
"""

from __future__ import annotations

from nanovllm.lessons.plug import swap_free_block_queue

ENGINE = dict(enable_prefix_caching=True, num_kv_blocks=48)
WORKLOAD = "waves"
COMPARE = "blocks"
MOMENT = "hit_from_the_middle"  # a new request pulls a cached block out of the middle


def plug_in(engine, impl) -> list[str]:
    swap_free_block_queue(engine, impl.FreeBlockQueue)
    return ["the free block queue: your `FreeBlockQueue`"]
