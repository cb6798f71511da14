"""The draft model's pass over every step's tokens, around the engine's executor.

With a draft model (`draft_model_proposer.py`), the draft keeps its own paged KV cache in the
target's blocks: every step, after the target's forward pass, the draft runs over exactly the
same tokens at the same positions and slots. `DraftKVExecutor` wraps the executor (one rank or
many) and makes that pass, so neither the runner nor the tensor-parallel executor knows about
drafts. Its seconds count as the step's forward time (they are model time).
"""

from __future__ import annotations

import time
from typing import Any

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.outputs import ModelRunnerOutput


class DraftKVExecutor:
    def __init__(self, executor: Any, runner: ModelRunner, draft: ModelRunner) -> None:
        self.executor = executor  # what runs the step: `execute(sched)`
        self.runner = runner  # rank 0's: its `last_inputs` are the step's inputs
        self.draft = draft  # the draft model's runner, on rank 0 alone

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        result = self.executor.execute(sched)
        start = time.perf_counter()
        self.draft.forward_logits(*self.runner.last_inputs[:3], [])  # the draft's KV, same slots
        self.runner.last_forward_time += time.perf_counter() - start
        return result
