"""Lesson 09 exercise: chunked prefill in the scheduler, and the flat inputs of a step.

From `nanovllm.lessons.sim`: `Req` (the scheduler's view), `ScheduledSeq` and `StepInputs` (the
model runner's view). Check with `nanovllm lesson 9 --check`.
"""

from __future__ import annotations

from nanovllm.lessons.sim import Req, ScheduledSeq, StepInputs  # noqa: F401


def schedule_step(
    running: list[Req], waiting: list[Req], max_num_seqs: int, token_budget: int
) -> dict[str, int]:
    """Lesson 06's step (memory is plentiful), with chunked prefill.

    1. Running requests, in order, while budget is left: `min(req.remaining, budget left)`
       tokens each (a request in the middle of its prefill gets its next chunk this way).
    2. Waiting requests from the front, while budget is left and len(running) < max_num_seqs:
       admit the front one (move it to the end of `running`) with `min(req.num_tokens, budget
       left)` tokens. A prompt longer than what is left gets a chunk of exactly what is left.

    Return {request id: tokens} in scheduling order; never change `num_computed`.
    """
    raise NotImplementedError("write schedule_step (lesson 09)")


def prepare_inputs(batch: list[ScheduledSeq], block_size: int) -> StepInputs:
    """The flat inputs of a step: every request's new tokens, one after the other.

    For request i with c = num_computed and n = num_new, in batch order:
      - input_ids: its token_ids[c : c + n]; positions: c, c+1, ..., c+n-1;
      - slot_mapping: each position's slot through its block table (lesson 02);
      - query_start_loc: starts at 0, then the running total of n (num_seqs + 1 entries);
      - seq_lens: c + n;
      - logits_rows: if c + n == len(token_ids) (it catches up, so it samples), the index of its
        LAST row in the flat batch; a chunk that stops short of the end gets no row.
    """
    raise NotImplementedError("write prepare_inputs (lesson 09)")
