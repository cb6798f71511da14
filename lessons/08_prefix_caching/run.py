"""Lesson 08 in the real engine: your hashes name every full block, your lookup finds them.

`nanovllm lesson 8 --run` makes the KV cache manager register every full block under your
`block_hashes` and look up every new request with your `cached_prefix`. Requests arrive in waves
that start with one of two long stage directions: the first requests compute them, the rest
reuse them. Besides the completions, the run compares every cache hit with the stock engine's.
"""

from __future__ import annotations

from nanovllm.lessons.plug import swap_prefix_cache

ENGINE = dict(enable_prefix_caching=True, num_kv_blocks=96)
WORKLOAD = "waves"
COMPARE = "cache_hits"
MOMENT = "first_hit"


def plug_in(engine, impl) -> list[str]:
    swap_prefix_cache(engine, impl)
    return ["block hashes: your `block_hashes`", "prefix lookups: your `cached_prefix`"]
