"""Lesson 09 planted bugs: chunking done wrong, and flat inputs built wrong."""

from __future__ import annotations

from nanovllm.lessons.sim import StepInputs
from nanovllm.lessons.testing import Mutant, variant


def _schedule(running, waiting, max_num_seqs, budget, *, bug=""):
    scheduled = {}
    for r in running:
        if budget <= 0 and bug != "learner-zero-token-entries":
            break
        n = 1 if bug == "chunks-advance-one-token" else min(r.remaining, budget)
        scheduled[r.id] = n
        budget -= n
    while waiting and budget > 0 and (len(running) < max_num_seqs or bug == "ignores-seats"):
        r = waiting[0]
        if r.num_tokens > budget and bug == "no-chunking":
            break
        n = r.num_tokens if bug == "chunk-ignores-budget" else min(r.num_tokens, budget)
        running.append(waiting.pop(0))
        scheduled[r.id] = n
        budget -= n
    return scheduled


def _prepare(batch, block_size, *, bug=""):
    ids, pos, slots, qsl, lens, rows = [], [], [], [0], [], []
    for seq in batch:
        c, n = seq.num_computed, seq.num_new
        start = 0 if bug == "positions-from-zero" else c
        for p in range(start, start + n):
            ids.append(seq.token_ids[p])
            pos.append(p)
            slot = seq.block_table[p // block_size] * block_size + p % block_size
            if bug == "slots-from-the-first-block":
                slot = seq.block_table[0] * block_size + p  # right until block 0 is full
            slots.append(slot + (1 if bug == "slot-off-by-one" else 0))
        qsl.append(qsl[-1] + n)
        lens.append(n if bug == "seq-len-is-chunk" else c + n)
        samples = c + n == len(seq.token_ids)
        if bug == "logits-for-every-request" or samples:
            rows.append(qsl[-2] if bug == "logits-first-row" else qsl[-1] - 1)
            if bug == "logits-row-in-the-request":
                rows[-1] = n - 1  # its row within its own tokens: right for the first request
    return StepInputs(ids, pos, slots, qsl, lens, rows)


def _sched_bug(name, description):
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, schedule_step=lambda *a: _schedule(*a, bug=name)),
    )


def _prep_bug(name, description):
    return Mutant(
        name,
        description,
        lambda ref: variant(ref, prepare_inputs=lambda *a: _prepare(*a, bug=name)),
    )


MUTANTS = [
    _sched_bug("no-chunking", "a prompt longer than the budget left waits, blocking the queue"),
    _sched_bug("chunk-ignores-budget", "an admitted prompt gets all its tokens, over budget"),
    _sched_bug(
        "chunks-advance-one-token", "running requests get one token per step, mid-prefill too"
    ),
    _prep_bug(
        "positions-from-zero", "a chunk's positions (and tokens) start at 0, not num_computed"
    ),
    _prep_bug("slot-off-by-one", "every token's slot is one too far"),
    _prep_bug("seq-len-is-chunk", "seq_lens holds the chunk length, not the context length"),
    _prep_bug("logits-for-every-request", "logits are computed for chunks that sample nothing"),
    _prep_bug("logits-first-row", "the logits row is a request's first row, not its last"),
    _prep_bug(
        "slots-from-the-first-block",
        "slots counted on from block 0: right until a position passes the first block",
    ),
    _prep_bug(
        "logits-row-in-the-request",
        "a logits row counted within its own request: right for the first one only",
    ),
    # Learner mistakes: wrong solutions written as a learner writes them (issue #52).
    _sched_bug(
        "learner-zero-token-entries",
        "once the budget runs out, the remaining running requests get entries of 0 tokens",
    ),
]
