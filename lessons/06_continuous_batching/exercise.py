"""Lesson 06 exercise: one step of continuous batching.

`Req` (from `nanovllm.lessons.sim`) is the scheduler's view of a request: `id`, `num_tokens`
(prompt + output so far), `num_computed` (tokens with K/V in the cache) and
`remaining = num_tokens - num_computed`. Check with `nanovllm lesson 6 --check`.
"""

from __future__ import annotations

from nanovllm.lessons.sim import Req


def schedule_step(
    running: list[Req], waiting: list[Req], max_num_seqs: int, token_budget: int
) -> dict[str, int]:
    """Decide one step: which requests compute how many tokens. Memory is plentiful; no chunking.

    1. Running requests, in list order (oldest first), while budget is left: each gets
       `min(req.remaining, budget left)` tokens.
    2. Then waiting requests from the front, while budget is left and
       `len(running) < max_num_seqs`: the request at the front needs all its `num_tokens` in
       this step (no chunked prefill). If that is more than the budget left, stop admitting
       (never skip ahead: first come, first served). Otherwise admit it: remove it from the
       front of `waiting`, append it to `running`, and give it `num_tokens` tokens.

    Return {request id: number of tokens}, in the order scheduled. Mutate only the two lists,
    never a request's `num_computed` (the engine advances it after the step has run).
    """
    raise NotImplementedError("write schedule_step (lesson 06)")
