"""`plug.YourScheduler`: a lesson's `schedule_step` deciding the engine's `Scheduler`'s steps.

Oracle: the stock `Scheduler`, driven alike. Lesson 07's reference `schedule_step` is the
engine's own step (`sim.schedule_with_engine`), so with it every step's output, preemptions
included, and the queues after it must be the stock scheduler's; the scheduler's own frame of
a step (its KV source's part) is kept whatever decides.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.config import EngineConfig
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.kv_source import NoKVSource
from nanovllm.core.scheduler import Scheduler
from nanovllm.events import EventBus
from nanovllm.lessons.catalog import get_lesson
from nanovllm.lessons.harness import implementation
from nanovllm.lessons.plug import LessonRunError, StepLimits, your_scheduler
from nanovllm.request import FinishReason, Request, RequestStatus
from nanovllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def _scheduler(cls, num_blocks: int, max_num_seqs: int, budget: int, **kwargs) -> Scheduler:
    config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
    )
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=False)
    return cls(config, kv, EventBus(), **kwargs)


def _lesson_07(max_num_seqs: int, budget: int, num_blocks: int):
    impl = implementation(get_lesson(7), "reference")

    def call(running, waiting, limits):
        assert limits == StepLimits(max_num_seqs, budget, num_blocks, BLOCK_SIZE)
        return impl.schedule_step(
            running,
            waiting,
            max_num_seqs=limits.max_num_seqs,
            token_budget=limits.token_budget,
            num_blocks=limits.num_blocks,
            block_size=limits.block_size,
        )

    return your_scheduler(call)


def _step(scheduler: Scheduler) -> tuple:
    """One step, its tokens sampled (token 0) and finished requests ended; what it decided."""
    out = scheduler.schedule()
    sampled = {s.request.request_id: [0] for s in out.scheduled if s.samples}
    for request, _ in scheduler.update_from_output(out, sampled):
        if request.num_output_tokens >= request.max_tokens:
            scheduler.finish_request(request, FinishReason.LENGTH)
    return (
        [(s.request.request_id, s.num_new_tokens, s.num_computed_tokens) for s in out.scheduled],
        [request.request_id for request in out.preempted],
        [request.request_id for request in scheduler.running],
        [r.request_id for r in scheduler.waiting if r.status != RequestStatus.FINISHED],
    )


@settings(max_examples=40, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(0, 3)),
        min_size=2,
        max_size=6,
    ),  # (prompt tokens, output tokens, arrival step): recomputed, at most the budget
    max_num_seqs=st.integers(1, 4),
    num_blocks=st.integers(4, 8),  # a request's 16 tokens at most fit in 4
)
def test_lesson_07s_reference_decides_every_step_as_the_stock_scheduler(
    requests, max_num_seqs, num_blocks
):
    budget = 16
    stock = _scheduler(Scheduler, num_blocks, max_num_seqs, budget)
    yours = _scheduler(
        _lesson_07(max_num_seqs, budget, num_blocks), num_blocks, max_num_seqs, budget
    )
    for step in range(200):
        for scheduler in (stock, yours):
            for i, (prompt, output, arrival) in enumerate(requests):
                if arrival == step:
                    request = Request(f"r{i}", [1] * prompt, SamplingParams(), arrival_index=i)
                    request.max_tokens = output
                    scheduler.add_request(request)
        if step > 3 and not stock.has_unfinished_requests():
            break
        assert _step(yours) == _step(stock), f"step {step + 1}"
    assert not stock.has_unfinished_requests() and not yours.has_unfinished_requests()


def test_the_learner_sees_its_queues_in_its_own_order():
    """A learner who reorders its waiting list sees that order next step (the scheduler's own
    queue keeps arrival order); new requests join at the back."""
    seen: list[list[str]] = []

    def reverse_waiting(running, waiting, limits):
        seen.append([r.id for r in waiting])
        waiting.reverse()
        return {}

    scheduler = _scheduler(your_scheduler(reverse_waiting), 8, 2, 16)
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", [1, 2], SamplingParams(), arrival_index=i))
    scheduler.schedule()
    scheduler.add_request(Request("r3", [1, 2], SamplingParams(), arrival_index=3))
    scheduler.schedule()
    assert seen == [["r0", "r1", "r2"], ["r2", "r1", "r0", "r3"]]
    assert [r.request_id for r in scheduler.waiting] == ["r0", "r1", "r2", "r3"]


def test_a_running_request_put_back_without_preemption_is_named():
    def admit_then_put_back(running, waiting, limits):
        if waiting:
            running.append(waiting.pop(0))
            return {running[-1].id: 1}
        waiting.append(running.pop())
        return {}

    scheduler = _scheduler(your_scheduler(admit_then_put_back), 8, 2, 16)
    scheduler.add_request(Request("r0", [1, 2], SamplingParams(), arrival_index=0))
    scheduler.schedule()
    try:
        scheduler.schedule()
    except LessonRunError as exc:
        assert "r0 went back to the waiting queue but was not preempted" in str(exc)
    else:
        raise AssertionError("no LessonRunError")


class _Source(NoKVSource):
    """A KV source whose metadata for the workers is a marker."""

    def build_connector_meta(self, scheduler_output):
        return "for the workers"


def test_the_kv_sources_part_of_the_step_is_kept():
    """The step's tail is the scheduler's, whoever decides: its KV source builds what it sends
    the workers."""
    scheduler = _scheduler(your_scheduler(lambda r, w, s: {}), 8, 2, 16, kv_source=_Source())
    assert scheduler.schedule().kv_connector_metadata == "for the workers"
