"""Lesson 06 planted bugs: schedulers that overfill, reorder, skip ahead or batch statically."""

from __future__ import annotations

from nanovllm.lessons.testing import Mutant, variant


def _schedule(running, waiting, max_num_seqs, budget, *, bug: str = ""):
    """A plain continuous-batching step with switches for the bugs."""
    scheduled: dict[str, int] = {}

    def run_running():
        nonlocal budget
        for r in running:
            if budget <= 0:
                break
            n = r.remaining if bug == "budget-overflow" else min(r.remaining, budget)
            if r.id not in scheduled:
                scheduled[r.id] = n
                budget -= n

    def admit():
        nonlocal budget
        if bug == "static-batching" and running:
            return  # a new batch starts only when the old one is completely done
        seats = max_num_seqs + 1 if bug == "seat-limit-off-by-one" else max_num_seqs
        i = 0
        while i < len(waiting) and budget > 0 and len(running) < seats:
            r = waiting[i]
            if r.num_tokens > budget:
                if bug == "skips-ahead":
                    i += 1  # let a smaller one behind it jump the queue
                    continue
                break
            waiting.pop(i)
            if bug != "forgets-to-move":
                running.append(r)
            scheduled[r.id] = r.num_tokens
            budget -= r.num_tokens * (2 if bug == "prompt-counted-twice" else 1)

    if bug == "waiting-first":
        admit()
        run_running()
    else:
        run_running()
        admit()
    return scheduled


def _bug(name: str, description: str) -> Mutant:
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, schedule_step=lambda *args: _schedule(*args, bug=name)),
    )


MUTANTS = [
    _bug("seat-limit-off-by-one", "admits up to max_num_seqs + 1 running requests"),
    _bug("budget-overflow", "running requests get all their remaining tokens, budget or not"),
    _bug("skips-ahead", "a prompt too big for the budget is overtaken by smaller ones behind it"),
    _bug("waiting-first", "admits waiting requests before serving the running ones"),
    _bug("static-batching", "admits nobody while any request is still running"),
    _bug("forgets-to-move", "admitted requests are scheduled but never join `running`"),
    _bug(
        "prompt-counted-twice",
        "an admitted prompt's tokens are taken from the budget twice: requests wait that fit",
    ),
]
