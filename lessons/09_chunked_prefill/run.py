"""Lesson 09 in the real engine: your chunked scheduler and your flat step inputs.

`nanovllm lesson 9 --run` builds the engine with a scheduler whose every step is your
`schedule_step` and with your `prepare_inputs` as its step-input builder (`step_inputs`). Prompts of 47-237 tokens meet a budget of 48 tokens
a step: most are prefilled in chunks, next to the requests decoding. The run compares your
decisions with the stock scheduler's at every step, and the completions token for token.
"""

from __future__ import annotations

from nanovllm.engine.parts import EngineParts
from nanovllm.lessons.plug import your_scheduler, your_step_inputs

ENGINE = dict(
    enable_prefix_caching=False,
    enable_chunked_prefill=True,
    max_num_seqs=8,
    max_num_batched_tokens=48,
    num_kv_blocks=256,
)
WORKLOAD = "long"
COMPARE = "schedule"
MOMENT = "chunk_with_decodes"  # a chunk beside decodes in one flat batch (executor panel)


def plug_in(impl) -> EngineParts:
    def call(running, waiting, limits):
        return impl.schedule_step(running, waiting, limits.max_num_seqs, limits.token_budget)

    return EngineParts(scheduler_cls=your_scheduler(call), step_inputs=your_step_inputs(impl))


def swapped(engine) -> list[str]:
    return [
        "every scheduling decision, chunks included: your `schedule_step`",
        "every step's flat inputs: your `prepare_inputs`",
    ]
