"""Lesson 09 reference: the engine's scheduler with chunked prefill, and its step inputs.

`prepare_inputs` hands the batch to `step_inputs` (executor/step_inputs.py: the plain version of what
the CPU and GPU backends' `InputBatch` computes every step) as a `SchedulerOutput` and reads its tensors back
as lists.
"""

from __future__ import annotations

from nanovllm.core.scheduler import ScheduledRequest, SchedulerOutput
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.lessons.sim import Req, ScheduledSeq, StepInputs, schedule_with_engine
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

__all__ = ["schedule_step", "prepare_inputs"]


def schedule_step(
    running: list[Req], waiting: list[Req], max_num_seqs: int, token_budget: int
) -> dict[str, int]:
    plan = schedule_with_engine(
        running,
        waiting,
        max_num_seqs=max_num_seqs,
        token_budget=token_budget,
        chunked_prefill=True,
    )
    return plan.scheduled


def prepare_inputs(batch: list[ScheduledSeq], block_size: int) -> StepInputs:
    scheduled = []
    for i, seq in enumerate(batch):
        request = Request(str(i), list(seq.token_ids), SamplingParams(), arrival_index=i)
        end = seq.num_computed + seq.num_new
        samples = end == len(seq.token_ids)
        scheduled.append(
            ScheduledRequest(
                request=request,
                num_new_tokens=seq.num_new,
                num_computed_tokens=seq.num_computed,
                block_tables=(list(seq.block_table),),
                samples=samples,
                is_prefill=not (seq.num_new == 1 and samples and seq.num_computed > 0),
            )
        )
    input_ids, positions, meta, logits_rows = step_inputs(
        SchedulerOutput(step=1, scheduled=scheduled), block_size
    )
    return StepInputs(
        input_ids=input_ids.tolist(),
        positions=positions.tolist(),
        slot_mapping=meta.slot_mapping.tolist(),
        query_start_loc=meta.query_start_loc.tolist(),
        seq_lens=meta.seq_lens.tolist(),
        logits_rows=list(logits_rows),
    )
