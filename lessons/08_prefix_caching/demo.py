"""Lesson 08 demo: four requests sharing a long prompt, with and without prefix caching.

The first request computes the shared prefix; the three after it find its full blocks by hash and
compute only their own questions. Then the same with prefix caching off. The outputs are the same
(greedy), the work is not.

Run it: `nanovllm lesson 8 --demo` (or `python demo.py`).
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine

SYSTEM = (
    "You are a player in Shakespeare's company. Shall I compare thee to a summer's day? Thou art "
    "more lovely and more temperate: rough winds do shake the darling buds of May, and summer's "
    "lease hath all too short a date. Answer in verse.\n"
)
QUESTIONS = ["ROMEO: What light?", "JULIET: Wherefore?", "HAMLET: To be?", "PUCK: Lord, what fools"]


def serve(prefix_caching: bool):
    from nanovllm import SamplingParams
    from nanovllm.events import CacheHit, StepSummary

    engine = make_engine(enable_prefix_caching=prefix_caching, block_size=8, num_kv_blocks=128)
    hits: list[CacheHit] = []
    steps: list[StepSummary] = []
    engine.subscribe(
        lambda e: (
            hits.append(e)
            if isinstance(e, CacheHit)
            else steps.append(e)
            if isinstance(e, StepSummary)
            else None
        )
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    results = {}
    for i, question in enumerate(QUESTIONS):  # one after the other, as chat turns arrive
        engine.add_request(str(i), SYSTEM + question, params)
        results.update(engine.run_until_done())
    prefill_tokens = sum(s.num_prefill_tokens for s in steps)
    return results, hits, prefill_tokens, engine


def run(console: Console) -> None:
    on, hits, prefill_on, engine = serve(True)
    off, _, prefill_off, _ = serve(False)
    num_system = len(engine.tokenizer.encode(SYSTEM))
    console.print(
        f"A shared prompt of {num_system} tokens, then a short question; blocks of 8 tokens.\n"
    )
    table = Table()
    for col in ("request", "prompt tokens", "served from the cache", "same output without caching"):
        table.add_column(col, justify="right" if col != "request" else "left")
    for rid in sorted(on):
        out = on[rid]
        same = out.outputs[0].token_ids == off[rid].outputs[0].token_ids
        table.add_row(
            rid,
            str(len(out.prompt_token_ids)),
            str(out.num_cached_tokens),
            "[green]yes[/]" if same else "[red]NO[/]",
        )
    console.print(table)
    console.print(
        f"Prompt tokens computed: {prefill_on} with prefix caching, {prefill_off} without. "
        f"{len(hits)} cache hits, on blocks {sorted({h.block_id for h in hits})}."
    )
    from nanovllm.core.block_hash import extend_block_hashes, short

    ids = engine.tokenizer.encode(SYSTEM)
    hashes: list[bytes] = []
    extend_block_hashes(hashes, ids, 8, len(ids))
    console.print("\nThe shared prompt's first blocks and their chained hashes:")
    for i, h in enumerate(hashes[:4]):
        text = engine.tokenizer.decode(ids[i * 8 : (i + 1) * 8])
        parent = short(hashes[i - 1]) if i else "(none)"
        console.print(
            f"  block {i}: hash {short(h)}, parent {parent}\n           {escape(repr(text))}"
        )
    console.print(
        "Request 0's blocks went back to the free queue with their hashes when it finished; "
        "the later requests found them there and pulled them out of the queue: no prefill."
    )


if __name__ == "__main__":
    run(Console())
