"""Lesson 15 in the real engine: your HostBlockTier keeps the KV the device pool evicts.

`nanovllm lesson 15 --run` builds both engines with an OffloadingConnector: a device pool of 40
blocks of 16 tokens (too few to keep ten documents' prefixes) over a host tier of 24 blocks
(too few to keep them all either), and in yours the tier's bookkeeping is your `HostBlockTier`
(the part `host_tier_cls`, given when your engine is built: `plug.your_host_tier`; every
answer of yours is checked before the engine acts on it: `plug.CheckedHostTier`). The workload
asks questions about ten documents in waves, so a document's blocks come back after the device
pool has handed them to others. Besides the greedy completions, the run compares
every block saved to the tier, dropped from it and loaded back with the stock engine's, by
hash (which free slot your tier takes is up to you), and reports how many prompt tokens the
tier's hits spared computing. Halfway, between two waves, both engines reset their prefix cache
(`LLMEngine.reset_prefix_cache`, which clears the host tier: your `clear`), and the waves after it
fill the tier again from empty. Once every request is done, both tiers forget every other
entry, one at a time (your `remove`: `plug.forget_the_host_tier`), and then take as many new
ones as they have slots: the freed slots first, then the kept entries' in LRU order.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.kv_transfer.host_tier import HostBlockTier
from nanovllm.lessons.plug import (
    forget_the_host_tier,
    host_tier_of,
    your_host_tier,
)

NUM_CPU_BLOCKS = 24
KV_TRANSFER_CONFIG = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"num_cpu_blocks": NUM_CPU_BLOCKS},
}
ENGINE = dict(enable_prefix_caching=True, num_kv_blocks=40, kv_transfer_config=KV_TRANSFER_CONFIG)
WORKLOAD = "revisits"
COMPARE = "tier"
MOMENT = "first_tier_hit"
# Before step 48, wave 4 of 8 arrives; wave 3 (steps 36 to 47) has finished by then.
RESET_PREFIX_CACHE_AT = (48,)
AFTER_SERVING = "the host tier forgetting half its entries one at a time, then filling up"


def plug_in(impl) -> EngineParts:
    return EngineParts(host_tier_cls=your_host_tier(impl.HostBlockTier))


def stock_parts() -> EngineParts:
    """The stock engine's parts: its own host tier, checked as yours is and kept for
    `after_serving`."""
    return EngineParts(host_tier_cls=your_host_tier(HostBlockTier))


def swapped(engine) -> list[str]:
    host_tier_of(engine)  # LessonRunError if the engine was built without your tier
    return [
        f"the host tier's bookkeeping ({NUM_CPU_BLOCKS} slots): your `HostBlockTier` "
        "(num_matched, lookup, touch and insert, every step; clear, when the prefix cache is "
        "reset halfway; remove, entry by entry, once the run is done)"
    ]


def after_serving(engine) -> list[str]:
    return forget_the_host_tier(engine)
