"""Lesson 06 in the real engine: your `schedule_step` decides every step.

`nanovllm lesson 6 --run` builds the engine with a scheduler (`scheduler_cls`) that shows your
`schedule_step` the engine's running and waiting requests (as `Req`s), and carries out what it
decides: admissions, and how many tokens each request computes. Memory is plentiful and there is
no chunked prefill, as in the exercise; 64 requests, at most 16 at once, finish at different
steps, so waiting requests take the freed seats, and the first step's prompts do not all fit in
its budget, so the queue's order decides who is admitted. N-gram speculation (lesson 13) is on:
a decoding request with tokens proposed after its own has more than one token to compute
(`Req.num_proposed`), which is when `min(remaining, budget left)` is more than 1. Besides the
completions, the run compares your decisions with the stock scheduler's at every step.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import your_scheduler

ENGINE = dict(
    enable_prefix_caching=False,
    enable_chunked_prefill=False,
    max_num_seqs=16,
    max_num_batched_tokens=256,
    num_kv_blocks=256,
    speculative_config={
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    },
)
WORKLOAD = "batch"
COMPARE = "schedule"
MOMENT = "seat_refilled"  # a request finishes and a waiting one takes its seat next step


def plug_in(impl) -> EngineParts:
    def call(running, waiting, limits):
        return impl.schedule_step(running, waiting, limits.max_num_seqs, limits.token_budget)

    return EngineParts(scheduler_cls=your_scheduler(call))


def swapped(engine) -> list[str]:
    return ["every scheduling decision: your `schedule_step`"]
