"""The scheduler's view of the world, small enough to write in a lesson and to simulate in a demo.

The engine's `Request` carries token ids, sampling parameters, a random generator, logprobs...
but the scheduler reads only two numbers from it:

    num_tokens     tokens the request has: its prompt plus what it has generated so far (plus,
                   with speculative decoding, lesson 13, the tokens proposed to follow them)
    num_computed   how many of those already have their K and V in the cache

Each step a request is given up to `num_tokens - num_computed` tokens to compute. When a step
brings it level (`num_computed == num_tokens`), that step also samples its next token, so
`num_tokens` grows by one and the request needs exactly one token next step (a *decode*).
Prefill, decode, chunked prefill and recomputation after preemption are all this one rule.

`Req` is that view and nothing more; the schedulers of lessons 06, 07 and 09 work on lists of
them, in the same order the engine keeps:

    running   admitted requests, oldest first (lesson 07 preempts from the end)
    waiting   not admitted yet, first come first served (a preempted request goes to the front)

`simulate` plays a whole workload through any such scheduler, advancing the requests the way the
engine does after each step; the demos plot it and the properties use it to check that every
request finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Req:
    id: str
    prompt_len: int
    max_output: int = 1  # the request finishes when it has generated this many tokens
    num_output: int = 0  # generated so far
    num_computed: int = 0  # tokens (prompt first, then output) whose K/V are in the cache
    arrival: int = 0  # the step at which it joins the waiting queue (for `simulate`)
    # Speculative decoding (lesson 13): tokens proposed after its last one, computed with it in
    # its next step to be verified. Only a running request has any; `simulate` proposes none.
    num_proposed: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output + self.num_proposed

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return self.num_tokens - self.num_computed

    @property
    def finished(self) -> bool:
        return self.num_output >= self.max_output

    def __repr__(self) -> str:
        return (
            f"Req({self.id!r}, tokens={self.num_tokens}, computed={self.num_computed}, "
            f"output={self.num_output}/{self.max_output})"
        )


def blocks_for(num_tokens: int, block_size: int) -> int:
    """KV blocks that hold `num_tokens` tokens: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


def blocks_held(running: list[Req], block_size: int) -> int:
    """Blocks the running requests hold between steps: enough for their computed tokens.

    (A request is given blocks for the tokens it is about to compute; once computed, those are
    exactly its `num_computed` tokens. A waiting or preempted request holds none.)
    """
    return sum(blocks_for(r.num_computed, block_size) for r in running)


@dataclass
class StepPlan:
    """A scheduler's decision for one step."""

    scheduled: dict[str, int]  # request id -> tokens to compute, in scheduling order
    preempted: list[str] = field(default_factory=list)  # ids, in the order they were preempted


# A scheduler for `simulate`: (running, waiting) -> the step's plan (or just its `scheduled`).
Scheduler = Callable[[list[Req], list[Req]], "StepPlan | dict[str, int]"]


@dataclass
class StepRecord:
    step: int
    scheduled: dict[str, int]
    preempted: list[str]
    finished: list[str]  # requests that produced their last token this step
    num_running: int  # after the step
    num_waiting: int

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())


def advance(running: list[Req], scheduled: dict[str, int]) -> list[Req]:
    """What the engine does after the forward pass: advance `num_computed`, sample a token for
    each request that caught up, and drop finished requests from `running`. Returns those."""
    by_id = {r.id: r for r in running}
    finished = []
    for rid, n in scheduled.items():
        r = by_id[rid]
        r.num_computed += n
        if r.num_computed == r.num_tokens:  # caught up: this step sampled its next token
            r.num_output += 1
            if r.finished:
                finished.append(r)
    for r in finished:
        running.remove(r)
    return finished


def simulate(requests: list[Req], schedule: Scheduler, max_steps: int = 10_000) -> list[StepRecord]:
    """Run `requests` (each joining at its `arrival` step) through `schedule` until all finish.

    Raises RuntimeError if they have not finished after `max_steps` steps (a scheduler that
    starves or loses a request).
    """
    pending = sorted(requests, key=lambda r: r.arrival)
    running: list[Req] = []
    waiting: list[Req] = []
    records: list[StepRecord] = []
    step = 0
    while pending or running or waiting:
        if step >= max_steps:
            raise RuntimeError(
                f"not finished after {max_steps} steps: running={running}, waiting={waiting}"
            )
        while pending and pending[0].arrival <= step:
            waiting.append(pending.pop(0))
        plan = schedule(running, waiting)
        if isinstance(plan, dict):
            plan = StepPlan(plan)
        finished = advance(running, plan.scheduled)
        records.append(
            StepRecord(
                step,
                dict(plan.scheduled),
                list(plan.preempted),
                [r.id for r in finished],
                len(running),
                len(waiting),
            )
        )
        step += 1
    return records


# --- the model runner's view (lesson 09) ---------------------------------------------------


@dataclass
class ScheduledSeq:
    """One request's part of a step, as the model runner receives it."""

    token_ids: list[int]  # all its tokens so far: prompt, then output
    num_computed: int  # tokens already in the KV cache
    num_new: int  # tokens to compute this step: positions num_computed .. num_computed+num_new-1
    block_table: list[int]  # long enough for every position computed this step


@dataclass
class StepInputs:
    """The flat inputs of one step: all requests' new tokens side by side, no padding."""

    input_ids: list[int]  # [num_tokens]
    positions: list[int]  # [num_tokens]
    slot_mapping: list[int]  # [num_tokens]: the cache slot of each new token's K/V
    query_start_loc: list[int]  # [num_seqs + 1]: request i's rows are [qsl[i], qsl[i + 1])
    seq_lens: list[int]  # [num_seqs]: context length after this step
    logits_rows: list[int]  # rows whose logits are needed: the last row of each request that
    # reaches its last known token this step (and so samples its next one)


def schedule_with_engine(
    running: list[Req],
    waiting: list[Req],
    *,
    max_num_seqs: int,
    token_budget: int,
    num_blocks: int | None = None,
    block_size: int = 16,
    chunked_prefill: bool = False,
) -> StepPlan:
    """One step of the engine's own `Scheduler` on this simplified state: the reference solution
    of lessons 06, 07 and 09.

    The state is replayed into a fresh engine scheduler (each running request allocates the
    blocks for its computed tokens, the waiting ones are queued in order), `schedule()` runs, and
    its decisions are written back: admitted requests move to `running`, preempted ones return
    to the front of `waiting` with the `num_computed` the engine gave them (0). Prefix caching is off. `num_blocks=None`
    means memory is never short (no preemption).
    """
    from nanovllm.config import EngineConfig
    from nanovllm.core.extra_tokens import ExtraTokens
    from nanovllm.core.kv_cache_manager import KVCacheManager
    from nanovllm.core.scheduler import Scheduler
    from nanovllm.events import EventBus
    from nanovllm.request import Request, RequestStatus
    from nanovllm.sampling_params import SamplingParams

    if num_blocks is None:  # room for every request at full length, and then some
        num_blocks = sum(blocks_for(r.num_tokens + 1, block_size) for r in running + waiting) + 1
    config = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=token_budget,
        enable_prefix_caching=False,
        enable_chunked_prefill=chunked_prefill,
    )
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False)
    proposed = {r.id: [0] * r.num_proposed for r in running + waiting}
    extra_tokens = ExtraTokens(lambda request: proposed[request.request_id])
    scheduler = Scheduler(config, kv, EventBus(), extra_tokens=extra_tokens)
    sim_of: dict[str, Req] = {}
    engine_of: dict[str, Request] = {}
    for i, r in enumerate(running + waiting):
        request = Request(r.id, [0] * r.prompt_len, SamplingParams(), arrival_index=i)
        for _ in range(r.num_output):
            request.append_output_token(0)
        sim_of[r.id], engine_of[r.id] = r, request
    for r in running:
        request = engine_of[r.id]
        if kv.allocate_slots(request, r.num_computed) is None:
            raise ValueError("the running requests hold more blocks than the cache has")
        request.num_computed_tokens = r.num_computed
        request.status = RequestStatus.RUNNING
        scheduler.requests[r.id] = request
        scheduler.running.append(request)
    for r in waiting:
        scheduler.add_request(engine_of[r.id])

    out = scheduler.schedule()

    for request in out.preempted:  # what the engine's preemption left them (0: KV recomputed)
        sim_of[request.request_id].num_computed = request.num_computed_tokens
    running[:] = [sim_of[request.request_id] for request in scheduler.running]
    waiting[:] = [sim_of[request.request_id] for request in scheduler.waiting]
    return StepPlan(
        {s.request.request_id: s.num_new_tokens for s in out.scheduled},
        [request.request_id for request in out.preempted],
    )
