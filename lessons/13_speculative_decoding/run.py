"""Lesson 13 in the real engine: your verification rules decide which proposals are kept.

`nanovllm lesson 13 --run` turns on n-gram speculation (up to 4 proposals per request and step,
looked up with 2- to 5-token matches) in both engines, and in yours (built with the part `sampler`:
`plug.YourVerification`) every proposal is verified by your `verify_greedy` or `verify_random`. The requests are long (8 lines of Shakespeare, 96
tokens each, so the model's own output repeats and the lookup finds proposals), first greedy,
then the same 8 sampled with a seed each. Greedy verification must leave the completions exactly
as the stock engine's, with every verification the same (the same proposals, as many
accepted). A sampled request's tokens cannot be compared one for one (your draws are not the
engine's: `YOUR_DRAWS`), so every sampled verification is checked against what rejection
sampling can emit: the accepted proposals, then a token the target allows at its place, and
never the very proposal it rejected (`plug.YourVerification`). The run reports the acceptance
rate.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import LessonRunError, your_verification

SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
}
ENGINE = dict(speculative_config=SPECULATIVE_CONFIG, num_kv_blocks=160)  # no preemption
WORKLOAD = "speculate"
YOUR_DRAWS = True
COMPARE = "verifications"
MOMENT = "rejected_block_freed"


def plug_in(impl) -> EngineParts:
    return EngineParts(sampler=your_verification(impl))


def swapped(engine) -> list[str]:
    if engine.config.speculative_config is None:
        raise LessonRunError("the engine does not speculate: give it a speculative_config")
    return ["every proposal's verification: your `verify_greedy` and `verify_random`"]
