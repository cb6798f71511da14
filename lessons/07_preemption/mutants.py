"""Lesson 07 planted bugs: wrong victims, lost victims, memory ignored."""

from __future__ import annotations

from nanovllm.lessons.sim import StepPlan, blocks_for
from nanovllm.lessons.testing import Mutant, variant


def _schedule(running, waiting, *, max_num_seqs, token_budget, num_blocks, block_size, bug=""):
    """A plain step with memory and preemption, with switches for the bugs."""
    budget = token_budget
    free = num_blocks - sum(blocks_for(r.num_computed, block_size) for r in running)
    scheduled: dict[str, int] = {}
    preempted: list[str] = []
    front = 0  # where a learner who keeps victims newest-first puts the next one
    i = 0
    while i < len(running) and budget > 0:
        r = running[i]
        n = min(r.remaining, budget)
        need = blocks_for(r.num_computed + n, block_size) - blocks_for(r.num_computed, block_size)
        stop = False
        while (need >= free if bug == "preempts-when-exactly-enough" else need > free) and (
            bug != "ignores-memory"
        ):
            victim = running.pop(0 if bug == "preempts-oldest" else -1)
            free += blocks_for(victim.num_computed, block_size)
            if bug != "keeps-computed":
                victim.num_computed = 0
            if bug == "victim-to-back":
                waiting.append(victim)
            elif bug == "learner-victims-newest-first":
                waiting.insert(front, victim)
                front += 1
            elif bug != "victim-lost":
                waiting.insert(0, victim)  # the newest first: victims end up in their order
            preempted.append(victim.id)
            if victim is r:
                stop = True
                break
            if bug == "preempts-oldest":
                i = max(i - 1, 0)
        if stop:
            break
        if r not in running:
            continue
        free -= need
        scheduled[r.id] = n
        budget -= n
        i = running.index(r) + 1
    if not preempted:
        while waiting and budget > 0 and len(running) < max_num_seqs:
            r = waiting[0]
            tokens = r.prompt_len if bug == "learner-admits-prompt-len" else r.num_tokens
            need = blocks_for(tokens, block_size)
            if tokens > budget or (need > free and bug != "admission-ignores-memory"):
                break
            waiting.pop(0)
            running.append(r)
            scheduled[r.id] = tokens
            budget -= tokens
            free -= need
    return StepPlan(scheduled, preempted)


def _bug(name: str, description: str) -> Mutant:
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, schedule_step=lambda *a, **kw: _schedule(*a, **kw, bug=name)),
    )


MUTANTS = [
    _bug("preempts-oldest", "the oldest running request is preempted instead of the newest"),
    _bug("keeps-computed", "a preempted request keeps its num_computed, though its KV is gone"),
    _bug("victim-lost", "a preempted request is dropped instead of going back to the queue"),
    _bug("victim-to-back", "a preempted request goes to the back of the queue"),
    _bug(
        "preempts-when-exactly-enough",
        "preempts although the free blocks are exactly enough (>= instead of >)",
    ),
    _bug("ignores-memory", "never preempts: running requests take blocks that do not exist"),
    _bug("admission-ignores-memory", "admits a request whether or not its blocks are free"),
    # Learner mistakes: wrong solutions written as a learner writes them (issue #52).
    _bug(
        "learner-victims-newest-first",
        "two or more victims in one step go back to the front of the queue newest first",
    ),
    _bug(
        "learner-admits-prompt-len",
        "admission gives a request prompt_len tokens, not num_tokens (a preempted request's "
        "output is forgotten)",
    ),
]
