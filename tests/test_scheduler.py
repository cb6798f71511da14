"""The scheduler under random arrivals, lengths, aborts and tiny KV budgets.

No neural network is needed to test scheduling. A `FakeRunner` stands in for the model executor
but keeps a *real* paged cache: each step it writes every scheduled token id into its slot
(through the block table, as the real slot mapping does), and when a request samples, it reads
the request's whole context back through its block table and checks it against the request's
tokens. The next token is a fixed function of that context. So the oracle is exact: every
request's output must equal what the same function gives when run alone, one token at a time,
whatever batching, chunking, preemption and prefix caching happened in between.

Lookahead (a draft model's slots, `num_lookahead_tokens`): after every step each decoding request
must hold `lookahead` slots past its newest token, in blocks of its own that the prefix cache
does not hold (the draft writes its KV there), and nothing may leak or stall because of them.

Speculative decoding: a rule proposes tokens for decoding requests (sometimes the right ones,
sometimes not). The FakeRunner writes the proposals' "KV" (their token ids) and verifies them
as the rejection sampler does greedily: each is accepted while it equals the fake model's next
token. Rejected slots hold wrong tokens, so the scheduler must step `num_computed_tokens` back
over them; the context check above and the reference output catch it if it does not.

Faults: a step whose forward pass writes garbage into some of the step's KV and then raises is
rolled back by the scheduler. Every block left in the prefix cache must still hold exactly its
tokens (an invariant checked after every rule), and requests that later hit those blocks must
still produce the reference output. Requests that copy an earlier prompt make prefix sharing,
also between requests admitted in the same step, frequent.
"""

from __future__ import annotations

import hashlib

import pytest
from budget import examples, steps
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nanovllm.config import EngineConfig
from nanovllm.core.extra_tokens import ExtraTokens
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.scheduler import Scheduler, SchedulerOutput
from nanovllm.engine.output_processor import drop_output_tokens_after
from nanovllm.events import EventBus
from nanovllm.request import FinishReason, Request, RequestStatus
from nanovllm.sampling_params import SamplingParams

VOCAB = 5


def next_token(context: list[int]) -> int:
    """The fake model: a deterministic function of the whole context."""
    return hashlib.sha256(bytes(context)).digest()[0] % VOCAB


def reference_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.cache: list[int | None] = [None] * (num_blocks * block_size)

    def execute_and_fail(self, out: SchedulerOutput, num_written: int) -> None:
        """A forward pass that writes garbage into the first `num_written` slots of the step's
        new tokens (a half-finished pass), then raises."""
        bs = self.block_size
        written = 0
        for s in out.scheduled:
            for pos in range(s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens):
                if written == num_written:
                    raise RuntimeError("injected fault")
                self.cache[s.block_table[pos // bs] * bs + pos % bs] = -1  # not a token: garbage
                written += 1
        raise RuntimeError("injected fault")

    def execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        bs = self.block_size
        for s in out.scheduled:  # write every new token first (as every layer does)
            tokens = s.request.all_token_ids + s.to_verify  # proposals after its own
            for pos in range(s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens):
                slot = s.block_table[pos // bs] * bs + pos % bs
                self.cache[slot] = tokens[pos]
        sampled = {}
        for s in out.scheduled:
            seq_len = s.num_computed_tokens + s.num_new_tokens
            context = [self.cache[s.block_table[p // bs] * bs + p % bs] for p in range(seq_len)]
            expected = (s.request.all_token_ids + s.to_verify)[:seq_len]
            assert context == expected, "the paged cache holds wrong KV"
            if s.samples:
                # Greedy verification: accept proposals while they are what the model says.
                own = s.request.num_tokens
                emitted = []
                for i, proposed in enumerate([*s.to_verify, None]):
                    emitted.append(next_token(context[: own + i]))
                    if proposed != emitted[-1]:
                        break
                sampled[s.request.request_id] = emitted
        return sampled


# The machine's engine: tiny block sizes and KV caches, token budgets, sequence limits.
SETUP_STRATEGIES = dict(
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(4, 24),
    budget=st.integers(1, 24),
    max_num_seqs=st.integers(1, 6),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
    lookahead=st.sampled_from([0, 0, 1, 3]),
)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(**SETUP_STRATEGIES)
    def setup(
        self, block_size, num_blocks, budget, max_num_seqs, chunked, prefix_caching, lookahead
    ) -> None:
        if not chunked:
            budget = max(budget, num_blocks * block_size)  # a whole prompt must fit a step
        self.config = EngineConfig(
            block_size=block_size,
            num_kv_blocks=num_blocks,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            enable_chunked_prefill=chunked,
            enable_prefix_caching=prefix_caching,
        )
        bus = EventBus()
        self.kv = KVCacheManager(num_blocks, block_size, prefix_caching, bus)
        # Each step's proposals, as the speculator keeps them: replaced after every step.
        self.proposals: dict[str, list[int]] = {}
        self.scheduler = Scheduler(
            self.config, self.kv, bus, extra_tokens=ExtraTokens(self.tokens_to_verify, lookahead)
        )
        self.lookahead = lookahead
        self.runner = FakeRunner(num_blocks, block_size)
        self.capacity = num_blocks * block_size
        self.counter = 0
        self.finished: dict[str, Request] = {}
        self.aborted: set[str] = set()
        self.steps_since_progress = 0
        self.prompts: list[list[int]] = []

    @rule(
        prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
        max_tokens=st.integers(1, 8),
    )
    def add(self, prompt: list[int], max_tokens: int) -> None:
        self._add(prompt, max_tokens)

    @precondition(lambda self: self.prompts)
    @rule(
        data=st.data(),
        tail=st.lists(st.integers(0, VOCAB - 1), max_size=4),
        max_tokens=st.integers(1, 8),
    )
    def add_copy(self, data, tail: list[int], max_tokens: int) -> None:
        """An earlier prompt again, maybe extended: its blocks are shared through the prefix
        cache, in the same step when both are admitted together."""
        self._add(data.draw(st.sampled_from(self.prompts)) + tail, max_tokens)

    @rule(
        prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
        max_tokens=st.integers(1, 8),
        n=st.integers(2, 4),
    )
    def add_family(self, prompt: list[int], max_tokens: int, n: int) -> None:
        """Parallel sampling: n requests of one prompt, queued together (as the engine does)."""
        for _ in range(n):
            self._add(prompt, max_tokens)

    def _add(self, prompt: list[int], max_tokens: int) -> Request | None:
        if len(prompt) + max_tokens - 1 + self.lookahead > self.capacity:
            return None  # the engine rejects these at the door (tested elsewhere)
        self.counter += 1
        req = Request(
            f"r{self.counter}", prompt, SamplingParams(max_tokens=max_tokens), self.counter
        )
        req.max_tokens = max_tokens
        self.scheduler.add_request(req)
        self.prompts.append(prompt)
        return req

    @rule(data=st.data())
    def propose(self, data) -> None:
        """Speculative decoding: proposals for the decoding requests, right or wrong."""
        for request in self.scheduler.running:
            if request.num_computed_tokens != request.num_tokens - 1:
                continue
            room = request.max_tokens - request.num_output_tokens - 1
            right = reference_output(request.prompt_token_ids, request.max_tokens)
            right = right[request.num_output_tokens : request.num_output_tokens + room]
            wrong = data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=room))
            proposal = data.draw(st.sampled_from([right, wrong, right[:1] + wrong]))[:room]
            self.proposals[request.request_id] = proposal

    def tokens_to_verify(self, request: Request) -> list[int]:
        return self.proposals.get(request.request_id, [])

    @rule(num_written=st.integers(0, 40))
    def failing_step(self, num_written: int) -> None:
        """The forward pass writes part of the step's KV, garbage, and raises: roll back."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return
        try:
            self.runner.execute_and_fail(out, num_written)
        except RuntimeError:
            self.scheduler.rollback_step(out)

    @precondition(lambda self: self.scheduler.requests)
    @rule(data=st.data())
    def abort(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.scheduler.requests)))
        self.scheduler.finish_request(self.scheduler.requests[rid], FinishReason.ABORT)
        self.aborted.add(rid)

    @rule(n=st.integers(1, 4))
    def step(self, n: int) -> None:
        for _ in range(n):
            self._one_step()

    def _one_step(self) -> None:
        out = self.scheduler.schedule()
        assert out.num_scheduled_tokens <= self.config.max_num_batched_tokens
        assert len(out.scheduled) <= self.config.max_num_seqs
        assert len(self.scheduler.running) <= self.config.max_num_seqs
        if self.scheduler.has_unfinished_requests():
            assert not out.is_empty, "work is waiting but nothing was scheduled: a stall"
        sampled = self.execute(out)
        if sampled is None:
            return  # the step was undone
        self.proposals = {}  # (the speculator's next ones replace them: here, none)
        for req, _ in self.scheduler.update_from_output(out, sampled):
            if req.num_output_tokens >= req.max_tokens:
                drop_output_tokens_after(req, req.max_tokens)
                self.scheduler.finish_request(req, FinishReason.LENGTH)
                self.finished[req.request_id] = req
            else:
                self._check_lookahead(req)

    def execute(self, out: SchedulerOutput) -> dict[str, list[int]] | None:
        """Run the step on the fake runner: each sampling request's new tokens (None: the step
        was undone, in subclasses that make it fail)."""
        return self.runner.execute(out)

    def _check_lookahead(self, request: Request) -> None:
        """The draft can write its KV at the request's next `lookahead` positions: they are in
        blocks the request holds alone, outside the prefix cache."""
        bs = self.kv.block_size
        blocks = self.kv.req_to_blocks[request.request_id]
        for pos in range(request.num_computed_tokens, request.num_computed_tokens + self.lookahead):
            assert pos // bs < len(blocks), f"no lookahead slot at position {pos}"
            block = blocks[pos // bs]
            assert block.ref_cnt == 1 and block.block_hash is None, "a lookahead slot is shared"

    @invariant()
    def cached_blocks_hold_their_tokens(self) -> None:
        """A block findable in the prefix cache holds exactly the tokens it is cached for."""
        if not hasattr(self, "scheduler"):
            return
        bs = self.kv.block_size
        for block in self.kv.cached_block_hash_to_block.values():
            content = self.runner.cache[block.block_id * bs : (block.block_id + 1) * bs]
            assert content == list(block.token_ids), f"block {block.block_id} caches stale KV"

    @invariant()
    def reference_counts_are_exact(self) -> None:
        """Each block is held by exactly as many requests as it has references."""
        if not hasattr(self, "scheduler"):
            return
        holders: dict[int, int] = {}
        for blocks in self.kv.req_to_blocks.values():
            for block in blocks:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        for block in self.kv.blocks:
            assert block.ref_cnt == holders.get(block.block_id, 0), block

    @invariant()
    def block_tables_are_current(self) -> None:
        """The block ids the scheduler hands out (a tuple kept between steps) are the request's
        blocks now, whatever grew or shrank its table since they were last read."""
        if not hasattr(self, "scheduler"):
            return
        for rid, blocks in self.kv.req_to_blocks.items():
            assert self.kv.block_tables(rid)[0] == tuple(b.block_id for b in blocks), rid

    @invariant()
    def queues_are_consistent(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        s = self.scheduler
        live_waiting = [r for r in s.waiting if r.status != RequestStatus.FINISHED]
        assert len(live_waiting) == s.num_waiting
        assert {r.request_id for r in live_waiting} | {r.request_id for r in s.running} == set(
            s.requests
        )
        for r in s.running:
            assert r.status == RequestStatus.RUNNING
        holders = set(self.kv.req_to_blocks)
        assert holders <= {r.request_id for r in s.running}, "only running requests hold blocks"

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        # Every request finishes within a bounded number of steps once arrivals stop.
        pending = sum(r.num_tokens + r.max_tokens for r in self.scheduler.requests.values())
        bound = 10 * (pending + 10) * (self.scheduler.num_preemptions + 2)
        steps = 0
        while self.scheduler.has_unfinished_requests():
            self._one_step()
            steps += 1
            assert steps < bound, "requests did not finish: starvation or livelock"
        assert self.kv.num_free_blocks == self.kv.num_blocks, "a block leaked"
        for rid, req in self.finished.items():
            assert req.output_token_ids == reference_output(req.prompt_token_ids, req.max_tokens), (
                rid
            )


SchedulerMachine.TestCase.settings = settings(
    max_examples=examples(120), stateful_step_count=steps(25), deadline=None
)
TestScheduler = pytest.mark.quick(SchedulerMachine.TestCase)


def test_preemption_happens_and_resumed_requests_finish_correctly() -> None:
    """A deliberate squeeze: 4 requests, room for about one. Preemption must occur."""
    config = EngineConfig(block_size=2, num_kv_blocks=6, max_num_batched_tokens=64, max_num_seqs=4)
    bus = EventBus()
    kv = KVCacheManager(6, 2, True, bus)
    scheduler = Scheduler(config, kv, bus)
    runner = FakeRunner(6, 2)
    requests = []
    for i in range(4):
        req = Request(f"r{i}", [i % VOCAB, 1, 2], SamplingParams(max_tokens=8), i)
        req.max_tokens = 8
        scheduler.add_request(req)
        requests.append(req)
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        for req, _ in scheduler.update_from_output(out, runner.execute(out)):
            if req.num_output_tokens >= req.max_tokens:
                scheduler.finish_request(req, FinishReason.LENGTH)
    assert scheduler.num_preemptions > 0
    assert any(r.num_preemptions > 0 for r in requests)
    for req in requests:
        assert req.output_token_ids == reference_output(req.prompt_token_ids, 8)
    assert kv.num_free_blocks == 6


def test_a_rejection_keeps_the_draft_models_lookahead_slots() -> None:
    """Lookahead 3 with one slot per block: wrong proposals are rejected, their blocks go back,
    but the 3 slots past the request's newest token stay, private, for the draft to write."""
    config = EngineConfig(block_size=1, num_kv_blocks=32)
    bus = EventBus()
    kv = KVCacheManager(32, 1, True, bus)
    proposals: dict[str, list[int]] = {}
    proposed = ExtraTokens(lambda r: proposals.get("r", []), num_slots_after=3)
    scheduler = Scheduler(config, kv, bus, extra_tokens=proposed)
    runner = FakeRunner(32, 1)
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=8), 0)
    request.max_tokens = 8
    scheduler.add_request(request)
    for step in range(3):  # the prefill, then two steps that verify wrong proposals
        if step:
            right = reference_output(request.prompt_token_ids, 8)[request.num_output_tokens]
            proposals["r"] = [(right + 1) % VOCAB] * 3  # the first is already wrong
        out = scheduler.schedule()
        scheduler.update_from_output(out, runner.execute(out))
        blocks = kv.req_to_blocks["r"]
        assert len(blocks) == request.num_computed_tokens + 3
        assert all(b.ref_cnt == 1 and b.block_hash is None for b in blocks[-3:])
        # The ids the next step will be scheduled with: without the rejected blocks.
        assert kv.block_tables("r")[0] == tuple(b.block_id for b in blocks)
    assert request.num_output_tokens == 3  # one token per step: every proposal was rejected


@pytest.mark.parametrize("num_written", [0, 5])
def test_a_failed_step_uncaches_the_blocks_its_requests_shared(num_written: int) -> None:
    """Two requests of one prompt admitted in the same step share its first blocks (the second
    hits what the first registered moments before, ref_cnt 2). The step fails before or while
    writing them: none of those blocks may stay findable, and the retry computes both again."""
    config = EngineConfig(block_size=4, num_kv_blocks=16)
    bus = EventBus()
    kv = KVCacheManager(16, 4, True, bus)
    scheduler = Scheduler(config, kv, bus)
    runner = FakeRunner(16, 4)
    prompt = [1, 2, 3, 4, 0, 1, 2, 3, 4]  # two full blocks and one token more
    requests = [Request(f"r{i}", prompt, SamplingParams(max_tokens=3), i) for i in range(2)]
    for request in requests:
        request.max_tokens = 3
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert [s.num_computed_tokens for s in out.scheduled] == [0, 8]  # the second one hit
    shared = {b for s in out.scheduled for b in s.block_table[:2]}
    assert len(shared) == 2 and all(kv.block_pool.blocks[b].ref_cnt == 2 for b in shared)
    with pytest.raises(RuntimeError):
        runner.execute_and_fail(out, num_written)
    scheduler.rollback_step(out)
    cached = {block.block_id for block in kv.cached_block_hash_to_block.values()}
    assert not cached & shared, "a block of the failed step is still in the prefix cache"
    while scheduler.has_unfinished_requests():  # the retry: both from scratch, right tokens
        out = scheduler.schedule()
        for request, _ in scheduler.update_from_output(out, runner.execute(out)):
            if request.num_output_tokens >= request.max_tokens:
                scheduler.finish_request(request, FinishReason.LENGTH)
    for request in requests:
        assert request.output_token_ids == reference_output(prompt, 3)
    assert kv.num_free_blocks == 16
