"""Lesson 08 in the real engine: your hashes name every full block, your lookup finds them.

`nanovllm lesson 8 --run` builds the engine with a KV cache manager (`plug.YourPrefixCache`) that
registers every full block under your
`block_hashes` and look up every new request with your `cached_prefix`. Requests arrive in waves
that start with one of two long stage directions: the first requests compute them, the rest
reuse them. Besides the completions, the run compares every cache hit with the stock engine's.
"""

from __future__ import annotations

import functools

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import YourPrefixCache

ENGINE = dict(enable_prefix_caching=True, num_kv_blocks=96)
WORKLOAD = "waves"
COMPARE = "cache_hits"
MOMENT = "first_hit"


def plug_in(impl) -> EngineParts:
    return EngineParts(kv_cache_manager_cls=functools.partial(YourPrefixCache, impl=impl))


def swapped(engine) -> list[str]:
    return ["block hashes: your `block_hashes`", "prefix lookups: your `cached_prefix`"]
