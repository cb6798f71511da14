"""Lesson 13 in the real engine: your verification rule decides which proposals are kept.

`nanovllm lesson 13 --run` turns on n-gram speculation (up to 4 proposals per request and step,
looked up with 2- to 5-token matches) in both engines, and in yours every proposal is verified
by your `verify_greedy`. The requests are greedy and long (8 lines of Shakespeare, 96 tokens
each): the model's own output repeats, so the lookup finds proposals. Greedy verification
must leave the completions exactly as the stock engine's, and every verification the same (the
same proposals, as many accepted); the run reports the acceptance rate. Your `verify_random` is
plugged in too, but greedy requests never call it: sampled tokens cannot be compared one for
one (your draws are not the engine's), which is why the properties test it statistically.
"""

from __future__ import annotations

from nanovllm.lessons.plug import swap_verification

SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
}
ENGINE = dict(speculative_config=SPECULATIVE_CONFIG)
WORKLOAD = "repeats"
COMPARE = "verifications"
MOMENT = "rejected_block_freed"


def plug_in(engine, impl) -> list[str]:
    swap_verification(engine, impl)
    return ["every proposal's verification: your `verify_greedy` (and `verify_random`)"]
