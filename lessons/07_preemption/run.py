"""Lesson 07 in the real engine: your `schedule_step` preempts when the KV cache runs out.

`nanovllm lesson 7 --run` builds the engine with a scheduler whose every step is your
`schedule_step` (as in lesson 06), on a KV cache of 24 blocks of 16 tokens for 64 requests of up to 60 tokens: the
running requests outgrow it, and your step must preempt the newest, which later recompute. The
run compares your decisions (admissions, tokens, victims) with the stock scheduler's at every
step, and the completions token for token: recomputation must not change anybody's output.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import your_scheduler

ENGINE = dict(
    enable_prefix_caching=False,
    enable_chunked_prefill=False,
    max_num_seqs=16,
    max_num_batched_tokens=256,
    num_kv_blocks=24,
)
WORKLOAD = "batch"
COMPARE = "schedule"
MOMENT = "preemption"


def plug_in(impl) -> EngineParts:
    def call(running, waiting, limits):
        return impl.schedule_step(
            running,
            waiting,
            max_num_seqs=limits.max_num_seqs,
            token_budget=limits.token_budget,
            num_blocks=limits.num_blocks,
            block_size=limits.block_size,
        )

    return EngineParts(scheduler_cls=your_scheduler(call))


def swapped(engine) -> list[str]:
    return ["every scheduling decision, preemptions included: your `schedule_step`"]
