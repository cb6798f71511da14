"""Lesson 09 demo: a long prompt arriving while others decode, with and without chunking.

Three requests are decoding when a 230-token prompt arrives. Without chunked prefill (and a budget
big enough for the whole prompt) its prefill is one big step, and every decoding request waits for
it. With a 32-token budget and chunking, the prompt is prefilled 32 tokens at a time alongside the
decodes. Greedy outputs are identical either way.

Run it: `nanovllm lesson 9 --demo` (or `python demo.py`).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine

LONG = (
    "Let me not to the marriage of true minds admit impediments. Love is not love which alters "
    "when it alteration finds, or bends with the remover to remove. O no! it is an ever-fixed mark "
    "that looks on tempests and is never shaken; it is the star to every wand'ring bark, whose "
    "worth's unknown, although his height be taken. Love's not Time's fool, though rosy lips and "
    "cheeks within his bending sickle's compass come; love alters not with his brief hours and "
    "weeks, but bears it out even to the edge of doom. If this be error and upon me proved, I "
    "never writ, nor no man ever loved. "
) * 2


def serve(chunked: bool):
    from nanovllm import SamplingParams
    from nanovllm.events import StepSummary

    engine = make_engine(
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=32 if chunked else 256,
        max_model_len=256,
        num_kv_blocks=96,
        enable_prefix_caching=False,
    )
    steps: list[StepSummary] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepSummary) else None)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i, prompt in enumerate(["ROMEO:", "JULIET:", "HAMLET:"]):
        engine.add_request(f"short{i}", prompt, params)
    for _ in range(4):  # they are decoding when the long prompt arrives
        engine.step()
    ids = engine.tokenizer.encode(LONG)[:230]
    engine.add_request(
        "long",
        {"prompt_token_ids": ids},
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
    )
    outputs = engine.run_until_done()
    return outputs, steps


def run(console: Console) -> None:
    chunked_out, chunked_steps = serve(True)
    whole_out, whole_steps = serve(False)

    console.print("With chunked prefill (budget 32), the steps after the long prompt arrives:")
    console.print("  step  long prompt  decodes  total tokens")
    for s in chunked_steps[4:14]:
        long_tokens = s.scheduled.get("long", 0)
        decodes = sum(1 for rid, n in s.scheduled.items() if rid != "long" and n == 1)
        console.print(
            f"  {s.step:>4}  {long_tokens:>11}  {decodes:>7}  {sum(s.scheduled.values()):>12}"
        )

    table = Table(title="\nThe decoding requests' view")
    table.add_column("")
    table.add_column("whole prefill", justify="right")
    table.add_column("chunked", justify="right")
    table.add_row(
        "largest step (tokens)",
        str(max(sum(s.scheduled.values()) for s in whole_steps)),
        str(max(sum(s.scheduled.values()) for s in chunked_steps)),
    )
    table.add_row(
        "longest step (ms)",
        f"{max(s.forward_time for s in whole_steps) * 1e3:.1f}",
        f"{max(s.forward_time for s in chunked_steps) * 1e3:.1f}",
    )
    table.add_row(
        "steps until the long prompt's first token",
        str(_first_token_step(whole_steps) - 4),
        str(_first_token_step(chunked_steps) - 4),
    )
    same = all(
        chunked_out[r].outputs[0].token_ids == whole_out[r].outputs[0].token_ids for r in whole_out
    )
    table.add_row("identical outputs", "", "[green]yes[/]" if same else "[red]NO[/]")
    console.print(table)
    console.print(
        "Chunking trades a little time-to-first-token for the long prompt against steady "
        "inter-token latency for everyone else: no step is ever bigger than the budget."
    )


def _first_token_step(steps) -> int:
    """The step whose forward pass finished the long prompt's prefill (its first token)."""
    done = 0
    for s in steps:
        done += s.scheduled.get("long", 0)
        if done >= 230:
            return s.step
    return -1


if __name__ == "__main__":
    run(Console())
