"""Lesson 16 in the real engine: your SlidingWindowManager keeps the sliding group's tables.

`nanovllm lesson 16 --run` builds both engines on the demo model read as Mistral (the same
weights, every layer's attention a window of 24 tokens: `demo_support.windowed_model_path`),
so its one KV cache group slides, and in yours that group's manager is your
`SlidingWindowManager` (the part `sliding_window_manager`, given when your engine is built:
`KVCacheCoordinator` makes the sliding group's manager from it). Requests arrive in waves that
start with one of two long stage directions, so the first requests of a wave compute them and
the rest hit them in the prefix cache: a hit needs only the last window's blocks, the blocks
before it null. Besides the greedy completions, the run compares every block handed out, hit
and given back (and the free queue's count) with the stock engine's: your window must free
the same blocks at the same step, in the same order.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.demo_support import windowed_model_path

SLIDING_WINDOW = 24
ENGINE = dict(enable_prefix_caching=True, num_kv_blocks=48)
WORKLOAD = "waves"
COMPARE = "blocks"
MOMENT = "first_hit"


def model():
    """The checkpoint both engines run: the demo model with a window of SLIDING_WINDOW."""
    return windowed_model_path(SLIDING_WINDOW)


def plug_in(impl) -> EngineParts:
    return EngineParts(sliding_window_manager=impl.SlidingWindowManager)


def swapped(engine) -> list[str]:
    return [
        f"the sliding group's block tables (a window of {SLIDING_WINDOW} tokens): your "
        "`SlidingWindowManager` (get_num_skipped_tokens and remove_skipped_blocks before every "
        "allocation, find_longest_cache_hit at every admission)"
    ]
