"""The requests `nanovllm lesson N --run` and `--viz` send through the engine.

Each lesson's idea needs a workload that exercises it: staggered finishes for continuous
batching, a cache too small for preemption, shared beginnings that arrive in waves for prefix
hits on freed blocks, prompts longer than a step for chunked prefill. All are built from a seed,
so both engines of a `--run` (yours and the stock one) get exactly the same requests, and the
same run every time.

Prompts are lines of Shakespeare (public domain), the embedded model's training text, so its
completions look like something.

    batch    64 requests at once, prompts of 12-38 tokens, 6-24 tokens each: they finish at
             different steps, and waiting requests take the freed seats
    waves    64 requests in 8 waves of 8, every one starting with one of two long "stage
             directions" (prompts of 56-69 tokens): the first wave computes them, later waves
             find them in the prefix cache, in blocks freed by the waves before
    long     64 requests whose prompts run to 47-237 tokens: most longer than a step's budget
    sampled  `batch`, sampled (temperature 0.8, top-k 40, top-p 0.9) with a seed per request
    short    8 requests of 6 tokens after 14-16: for a slow path (Triton's interpreter on a CPU)
    repeats  8 requests of 96 tokens each, after one of the lines below: long greedy outputs, in
             which the model repeats itself (speculative decoding finds n-grams to propose)
    speculate  `repeats`, then the same 8 prompts sampled (s0-s7), with seeds 8-15: proposals
             verified greedily and by rejection sampling (under these seeds the engine's own
             draws reach a bonus token that a wrong row of lesson 13 gives probability 0; under
             seeds 0-7 they did not, since the CPU's draws became vLLM's)
    revisits 48 requests in 8 waves of 6, each a question (one line) about one of 10
             "documents" (4 lines each, 50-75 tokens): a document comes back waves later,
             after a small KV cache has handed its blocks to others (a second tier finds them)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LINES: tuple[str, ...] = (
    "BRUTUS:\nThere is a tide in the affairs of men,",
    "CASSIUS:\nThe fault, dear Brutus, is not in our stars,",
    "HELENA:\nLove looks not with the eyes, but with the mind;",
    "LYSANDER:\nThe course of true love never did run smooth;",
    "BENEDICK:\nI do love nothing in the world so well as you:",
    "BEATRICE:\nI had rather hear my dog bark at a crow",
    "MALVOLIO:\nSome are born great, some achieve greatness,",
    "ORLANDO:\nI do desire we may be better strangers.",
    "ROSALIND:\nThe fool doth think he is wise,",
    "POLONIUS:\nNeither a borrower nor a lender be;",
    "OPHELIA:\nThere's rosemary, that's for remembrance;",
    "CORDELIA:\nNothing, my lord.",
    "GLOUCESTER:\nAs flies to wanton boys, are we to the gods;",
    "MIRANDA:\nO brave new world, that has such people in't!",
    "CALIBAN:\nBe not afeard; the isle is full of noises,",
    "SHYLOCK:\nIf you prick us, do we not bleed?",
)

STAGE_DIRECTIONS: tuple[str, ...] = (
    "ACT I. SCENE I. A public place. Enter the citizens, with staves, clubs and other weapons;"
    " the trumpets sound, and the whole court comes forth in state to hear the quarrel.\n",
    "ACT III. SCENE II. A room in the castle. Enter the king and queen, with lords and"
    " attendants, and the players, who bow and take their places before the company.\n",
)


@dataclass(frozen=True)
class Arrival:
    """One request: it is added to the engine before step `step` runs."""

    request_id: str
    prompt: str
    max_tokens: int
    step: int = 0
    seed: int | None = None  # set: sampled with this seed; None: greedy


WORKLOADS = ("batch", "waves", "long", "sampled", "short", "repeats", "speculate", "revisits")


def make_workload(kind: str, seed: int = 0) -> list[Arrival]:
    """The workload called `kind` (see the module docstring)."""
    rng = random.Random(seed)
    if kind in ("batch", "sampled"):
        out = [
            Arrival(
                f"r{i}", _opening(rng), rng.randint(6, 24), seed=i if kind == "sampled" else None
            )
            for i in range(64)
        ]
        return out
    if kind == "waves":
        return [
            Arrival(
                f"r{i}",
                rng.choice(STAGE_DIRECTIONS) + rng.choice(LINES),
                rng.randint(6, 16),
                step=(i // 8) * 20,  # a wave every 20 steps: the last one has finished by then
            )
            for i in range(64)
        ]
    if kind == "long":
        return [
            Arrival(f"r{i}", "\n".join(_opening(rng) for _ in range(rng.randint(3, 8))), 8)
            for i in range(64)
        ]
    if kind == "short":
        return [Arrival(f"r{i}", LINES[i], 6) for i in range(8)]
    if kind == "repeats":
        return [Arrival(f"r{i}", LINES[i], 96) for i in range(8)]
    if kind == "speculate":
        sampled = [Arrival(f"s{i}", LINES[i], 96, seed=8 + i) for i in range(8)]
        return make_workload("repeats") + sampled
    if kind == "revisits":
        documents = ["\n".join(rng.sample(LINES, 4)) for _ in range(10)]
        return [
            Arrival(
                f"r{i}",
                rng.choice(documents) + "\n" + rng.choice(LINES),
                8,
                step=(i // 6) * 12,  # a wave every 12 steps: the one before has finished
            )
            for i in range(48)
        ]
    raise ValueError(f"no workload {kind!r}; the workloads are {', '.join(WORKLOADS)}")


def _opening(rng: random.Random) -> str:
    """One or two lines: prompts of different lengths."""
    text = rng.choice(LINES)
    return text + "\n" + rng.choice(LINES) if rng.random() < 0.5 else text
