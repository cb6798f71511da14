"""Lesson 10 in the real engine: your filters pick the tokens, your detokenizer writes the text.

`nanovllm lesson 10 --run` samples (temperature 0.8, top-k 40, top-p 0.9, a seed per request)
with your `apply_top_k` and `apply_top_p`, and turns every step's tokens into text with your
`detokenize_step`. Each request draws from its own seeded generator, in both engines, so the
same filters give the same tokens: the run compares the tokens and the text of all 64.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import your_sampling

ENGINE: dict = {}
WORKLOAD = "sampled"
COMPARE = "text"
MOMENT = None


def plug_in(impl) -> EngineParts:
    return EngineParts(**your_sampling(impl))


def swapped(engine) -> list[str]:
    return ["top-k and top-p: your filters", "every step's text: your `detokenize_step`"]
