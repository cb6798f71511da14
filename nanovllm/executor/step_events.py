"""The executor's step as events, for whoever watches: the inputs it built, then each stage.

The scheduler's events say *who* runs; these say what the model executor did with it, in the
order it does it: the flat inputs prepared (`step_inputs.py`), every layer's K/V written through
the slot mapping, paged attention reading each request's context through its block table, the
logits of the rows that sample, the sampled tokens. The figures are the runner's own: the
tensors it handed the model (`ModelRunner.last_inputs`) and the tokens it sampled, turned into
plain tuples after the step ran.

`ObservedExecutor` wraps the engine's executor (a runner, the tensor-parallel executor or the KV
connector's) and does this only while someone subscribes (`EventBus.active`): with no
subscriber a step costs one call and one attribute read more, and nothing is copied (the runner
keeps a reference to its last step's inputs, `last_inputs`, whoever listens).

`probe_attention` adds what one layer's attention computed for one request
(`attention_probe.py`), from the next step on, until it is called with None.
"""

from __future__ import annotations

from typing import Any

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.events import (
    AttentionComputed,
    Event,
    EventBus,
    KVWritten,
    LogitsComputed,
    StepInputsPrepared,
    TokensSampled,
)
from nanovllm.executor.attention_probe import AttentionProbe
from nanovllm.executor.expert_load_events import ExpertLoadReader
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.executor.step_inputs import StepInputs


def _ints(values: Any) -> tuple[int, ...]:
    """A tensor, an array or a list of ints as a tuple of Python ints."""
    values = values.tolist() if hasattr(values, "tolist") else values
    return tuple(int(v) for v in values)


def executor_events(
    sched: SchedulerOutput,
    inputs: StepInputs,
    result: ModelRunnerOutput,
    block_size: int,
    num_layers: int,
    vocab_size: int,
    attention_backend: str,
) -> list[Event]:
    """The step's five executor events, from the inputs the runner used and what it sampled."""
    input_ids, positions, meta, logits_rows = inputs
    step = sched.step
    request_ids = tuple(s.request.request_id for s in sched.scheduled)
    seq_lens = _ints(meta.seq_lens_list)
    # Each request's row of the padded [num_seqs, max_blocks] table, cut to the blocks its
    # attention reads (the padding and a draft model's lookahead blocks are never read).
    padded = meta.block_tables.tolist()
    tables = tuple(
        tuple(int(b) for b in row[: -(-n // block_size)]) for row, n in zip(padded, seq_lens)
    )
    sampling = [s for s in sched.scheduled if s.samples]
    num_sampled_rows = sum(1 + len(s.to_verify) for s in sampling)
    rows = _ints(logits_rows)
    slots = _ints(meta.slot_mapping)
    sampled_ids = tuple(
        s.request.request_id for s in sampling if s.request.request_id in result.sampled_token_ids
    )
    # A hybrid model's other KV cache groups (`kv_cache_groups.py`): their slots and tables.
    groups = meta.kv_cache_groups[1:]
    group_slots = tuple(_ints(g.slot_mapping) for g in groups)
    group_tables = tuple(
        tuple(
            tuple(int(b) for b in row[: -(-n // block_size)])
            for row, n in zip(g.block_tables.tolist(), seq_lens)
        )
        for g in groups
    )
    return [
        StepInputsPrepared(
            step=step,
            block_size=block_size,
            request_ids=request_ids,
            input_ids=_ints(input_ids),
            positions=_ints(positions),
            slot_mapping=slots,
            query_start_loc=_ints(meta.query_start_list),
            seq_lens=seq_lens,
            block_tables=tables,
            logits_rows=rows,
            num_sampled_rows=num_sampled_rows,
            group_slot_mappings=group_slots,
            group_block_tables=group_tables,
        ),
        KVWritten(step, slots, num_layers, group_slots),
        AttentionComputed(step, request_ids, seq_lens, attention_backend),
        LogitsComputed(step, rows, vocab_size),
        TokensSampled(
            step, sampled_ids, tuple(_ints(result.sampled_token_ids[r]) for r in sampled_ids)
        ),
    ]


class ObservedExecutor:
    """The engine's executor, telling its step as events while someone subscribes."""

    def __init__(self, executor: Any, runner: ModelRunner, events: EventBus, backend: str) -> None:
        self.executor = executor  # what runs the step: `execute(sched)`
        self.runner = runner  # rank 0's: its `last_inputs` are the step's inputs
        self.events = events
        self.attention_backend = backend
        self.probe: AttentionProbe | None = None  # `probe_attention`: one request, one layer
        self.expert_loads = ExpertLoadReader(runner.model)  # (a dense model's reads nothing)

    def probe_attention(self, request_id: str | None, layer: int = 0) -> None:
        """Tell what layer `layer`'s attention computes for `request_id` from the next step on
        (an `AttentionProbed` event before its `AttentionComputed`); None: stop."""
        runner = self.runner
        probe = (
            None
            if request_id is None
            else AttentionProbe(runner.model, runner.block_size, request_id, layer)
        )
        if self.probe is not None:
            self.probe.remove()
        self.probe = probe
        if probe is not None:
            probe.install()

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        probe = self.probe
        if probe is not None and self.events.active:
            probe.arm(sched)
        result = self.executor.execute(sched)
        if self.events.active:
            args = self.runner.model.args
            probed = probe.event(sched.step) if probe is not None else None
            for event in executor_events(
                sched,
                self.runner.last_inputs,
                result,
                self.runner.block_size,
                args.num_hidden_layers,
                args.vocab_size,
                self.attention_backend,
            ):
                if probed is not None and isinstance(event, AttentionComputed):
                    self.events.emit(probed)  # (a detail of attention, before its summary)
                self.events.emit(event)
            loads = self.expert_loads.event(sched.step)  # (a mixture of experts'; dense: None)
            if loads is not None:
                self.events.emit(loads)
        return result
