"""Lesson 06 properties: one step of continuous batching, and whole workloads through it."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from nanovllm.lessons.sim import Req, simulate
from nanovllm.lessons.strategies import SchedState, sched_states
from nanovllm.lessons.testing import lesson_settings, returned, show_inputs


def _step(impl, state: SchedState):
    """Run one step on a fresh copy of `state`: (before, after, scheduled)."""
    running, waiting = state.build()
    before = (list(running), list(waiting), {r.id: r.num_computed for r in running + waiting})
    scheduled = impl.schedule_step(running, waiting, state.max_num_seqs, state.token_budget)
    returned("schedule_step returned", scheduled)
    returned("then running", [getattr(r, "id", r) for r in running])
    returned("then waiting", [getattr(r, "id", r) for r in waiting])
    return before, (running, waiting), dict(scheduled)


@lesson_settings(30)
@given(state=sched_states())
# One seat left and two requests that fit: the second must wait (max_num_seqs + 1 would run).
@example(
    state=SchedState(
        running=((5, 1, 5),), waiting=((2, 0), (2, 0)), max_num_seqs=2, token_budget=20
    )
)
# A running request with more left to compute than the whole budget: it gets the budget.
@example(state=SchedState(running=((30, 0, 10),), waiting=(), max_num_seqs=2, token_budget=8))
@show_inputs
def test_budget_and_seats_are_respected(impl, state):
    """A step stays within its token budget, every scheduled request gets 1+ tokens, and at most
    max_num_seqs run."""
    _, (running, _), scheduled = _step(impl, state)
    assert sum(scheduled.values()) <= state.token_budget, "the step is over its token budget"
    assert all(n >= 1 for n in scheduled.values()), "a scheduled request must get 1+ tokens"
    assert len(running) <= state.max_num_seqs, "more requests running than max_num_seqs"


@lesson_settings(30)
@given(state=sched_states())
# A running request and a waiting one, room for both: the running one is scheduled first.
@example(state=SchedState(running=((5, 1, 5),), waiting=((3, 0),), max_num_seqs=4, token_budget=10))
@show_inputs
def test_running_requests_go_first_in_order(impl, state):
    """Running requests are scheduled first, oldest first, each min(remaining, budget left)
    tokens."""
    (old_running, _, _), _, scheduled = _step(impl, state)
    left = state.token_budget
    order = list(scheduled)
    for i, r in enumerate(old_running):
        if left == 0:
            assert r.id not in scheduled, f"{r.id} was scheduled with no budget left"
            continue
        want = min(r.remaining, left)
        assert scheduled.get(r.id) == want, (
            f"running request {r.id} needs {r.remaining} with {left} budget left: it must get "
            f"{want}, got {scheduled.get(r.id)}"
        )
        assert order[i] == r.id, "running requests are scheduled first, oldest first"
        left -= want


@lesson_settings(30)
@given(state=sched_states())
@example(
    state=SchedState(
        running=((5, 1, 5),), waiting=((30, 0), (3, 0)), max_num_seqs=4, token_budget=10
    )
)
@show_inputs
def test_admission_is_first_come_first_served(impl, state):
    """Admitted requests are the front of the waiting queue, in order, each with its whole prompt."""
    (old_running, old_waiting, _), (running, waiting), scheduled = _step(impl, state)
    admitted = running[len(old_running) :]
    assert running[: len(old_running)] == old_running, "running requests keep their places"
    assert admitted == old_waiting[: len(admitted)], "admitted requests are the front of the queue"
    assert waiting == old_waiting[len(admitted) :], "the rest wait, in the same order"
    for r in admitted:
        assert scheduled.get(r.id) == r.num_tokens, (
            f"admitted {r.id} must get its whole prompt ({r.num_tokens}), got {scheduled.get(r.id)}"
        )
    assert set(scheduled) <= {r.id for r in running}, "only running requests are scheduled"


@lesson_settings(30)
@given(state=sched_states())
@example(state=SchedState(running=((5, 1, 5),), waiting=((3, 0),), max_num_seqs=4, token_budget=10))
@example(state=SchedState(running=(), waiting=((3, 0), (3, 0)), max_num_seqs=4, token_budget=8))
@show_inputs
def test_admission_stops_only_for_a_reason(impl, state):
    """A request is left waiting only when the seats are full or its prompt does not fit the
    budget left."""
    _, (running, waiting), scheduled = _step(impl, state)
    if waiting:
        left = state.token_budget - sum(scheduled.values())
        head = waiting[0]
        assert len(running) >= state.max_num_seqs or head.num_tokens > left, (
            f"{head.id} ({head.num_tokens} tokens) was left waiting with {left} budget left and "
            f"{state.max_num_seqs - len(running)} free seats"
        )


def _by_the_rule(state: SchedState) -> tuple[list[tuple[str, int]], list[str], list[str]]:
    """One step as the exercise's docstring says it, written out here (not the engine's code: the
    check must not share a fault with what it checks): the scheduled (id, tokens) in order, then
    the ids running and waiting after it."""
    running, waiting = state.build()
    budget, scheduled = state.token_budget, []
    for req in running:
        if budget == 0:
            break
        scheduled.append((req.id, min(req.remaining, budget)))
        budget -= scheduled[-1][1]
    while waiting and budget > 0 and len(running) < state.max_num_seqs:
        if waiting[0].num_tokens > budget:
            break
        req = waiting.pop(0)
        running.append(req)
        scheduled.append((req.id, req.num_tokens))
        budget -= req.num_tokens
    return scheduled, [r.id for r in running], [r.id for r in waiting]


@lesson_settings(40)
@given(state=sched_states())
# The budget has exactly one token left for a one-token prompt: it is admitted.
@example(state=SchedState(running=((4, 0, 1),), waiting=((1, 0),), max_num_seqs=3, token_budget=4))
@show_inputs
def test_the_step_is_exactly_the_rule(impl, state):
    """The scheduled requests, their tokens, their order, and the two lists after the step are
    exactly what the rule gives, whatever the budget, the seats and the queue."""
    _, (running, waiting), scheduled = _step(impl, state)
    expected, expected_running, expected_waiting = _by_the_rule(state)
    assert list(scheduled.items()) == expected, (
        f"scheduled {list(scheduled.items())}; the rule schedules {expected}"
    )
    assert [r.id for r in running] == expected_running, (
        f"running after the step: {[r.id for r in running]}, expected {expected_running}"
    )
    assert [r.id for r in waiting] == expected_waiting, (
        f"waiting after the step: {[r.id for r in waiting]}, expected {expected_waiting}"
    )


@lesson_settings(30)
@given(state=sched_states())
@show_inputs
def test_nothing_else_changes(impl, state):
    """No request is lost or duplicated, and no num_computed changes: the engine advances it after
    the step."""
    (_, _, computed), (running, waiting), _ = _step(impl, state)
    ids = [r.id for r in running + waiting]
    assert sorted(ids) == sorted(computed), "a request was lost or duplicated"
    for r in running + waiting:
        assert r.num_computed == computed[r.id], "schedule_step must not change num_computed"


@lesson_settings(25)
@given(
    jobs=st.lists(
        st.tuples(st.integers(1, 24), st.integers(1, 12), st.integers(0, 6)),
        min_size=1,
        max_size=10,
    ),
    max_num_seqs=st.integers(1, 4),
    budget=st.integers(24, 48),
)
@show_inputs
def test_every_request_finishes(impl, jobs, max_num_seqs, budget):
    """Whole workloads, (prompt, output, arrival step) per request: all finish, soon enough."""
    requests = [Req(f"q{i}", p, max_output=o, arrival=a) for i, (p, o, a) in enumerate(jobs)]
    bound = 10 + sum(o + 1 for _, o, _ in jobs)  # serving them one at a time would do this
    records = simulate(
        requests,
        lambda running, waiting: impl.schedule_step(running, waiting, max_num_seqs, budget),
        max_steps=bound,
    )
    for r in requests:
        assert r.num_output == r.max_output, f"{r.id} generated {r.num_output}/{r.max_output}"
    assert all(rec.num_tokens <= budget for rec in records)
