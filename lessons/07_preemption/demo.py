"""Lesson 07 demo: the engine preempting requests in a cache too small for all of them.

Six requests run twice with greedy sampling: once with a KV cache of 10 blocks (they need up to
about 5 each), once with plenty. The small cache forces preemptions, and yet every output is
identical: the recomputed K/V are the same numbers.

Run it: `nanovllm lesson 7 --demo` (or `python demo.py`).
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine


def serve(num_kv_blocks: int) -> tuple[dict[str, list[int]], list, int]:
    """Run the six requests; return their tokens, the preemption events and the step count."""
    from nanovllm import SamplingParams
    from nanovllm.events import RequestPreempted, StepSummary

    engine = make_engine(num_kv_blocks=num_kv_blocks, max_num_seqs=6)
    prompts = [
        "ROMEO: But soft, what light",
        "JULIET: O Romeo, Romeo",
        "Shall I compare thee",
        "Let me not to the marriage",
        "So long as men can breathe",
        "Rough winds do shake",
    ]
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0, max_tokens=40 + 4 * i, ignore_eos=True)
        engine.add_request(f"req{i}", prompt, params)
    preemptions: list = []
    steps: list = []
    engine.subscribe(
        lambda e: (
            preemptions.append(e)
            if isinstance(e, RequestPreempted)
            else steps.append(e)
            if isinstance(e, StepSummary)
            else None
        )
    )
    outputs = engine.run_until_done()
    return {rid: out.outputs[0].token_ids for rid, out in outputs.items()}, preemptions, len(steps)


def run(console: Console) -> None:
    small, events, small_steps = serve(num_kv_blocks=10)
    large, _, large_steps = serve(num_kv_blocks=64)
    console.print(
        f"A cache of 10 blocks x 16 tokens: {len(events)} preemptions, "
        f"{sum(e.num_computed_tokens_lost for e in events)} computed tokens thrown away and "
        f"recomputed; {small_steps} steps (vs {large_steps} with a large cache).\n"
    )
    for e in events[:6]:
        console.print(
            f"  step {e.step:>3}: [yellow]{e.request_id}[/] preempted, "
            f"losing the K/V of {e.num_computed_tokens_lost} tokens"
        )
    if len(events) > 6:
        console.print(f"  ... and {len(events) - 6} more")
    per_request = Counter(e.request_id for e in events)
    table = Table(title="\nSame outputs with and without preemption?")
    for col in ("request", "tokens", "times preempted", "identical output"):
        table.add_column(col, justify="right" if col != "request" else "left")
    for rid in sorted(large):
        same = small[rid] == large[rid]
        table.add_row(
            rid,
            str(len(large[rid])),
            str(per_request.get(rid, 0)),
            "[green]yes[/]" if same else "[red]NO[/]",
        )
    console.print(table)
    console.print(
        "The victims were always the newest running requests; the oldest kept going and freed "
        "their blocks, so everyone finished."
    )


if __name__ == "__main__":
    run(Console())
