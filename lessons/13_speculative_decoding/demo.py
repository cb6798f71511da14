"""Lesson 13 demo: proposals from the text itself, verified in one forward pass.

1. One request decoding with n-gram speculation: at each step, the tokens proposed (found
   earlier in its own text), which the model accepted, and the token it added.
2. The same 8 requests with and without speculation: the same tokens, in fewer steps.
3. Rejection sampling in miniature: a draft distribution q unlike the target's p, and 20,000
   verifications of one proposal drawn from q: what comes out is distributed as p.

Run it: `nanovllm lesson 13 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nanovllm.lessons.demo_support import make_engine, section

SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
}


def _shown(piece: str) -> str:
    return piece.replace(" ", "␣").replace("\n", "⏎")


def run(console: Console) -> None:
    from nanovllm import SamplingParams
    from nanovllm.lessons.workload import make_workload

    section(console, "1. One request, speculating")
    engine = make_engine(speculative_config=SPEC)
    tok = engine.tokenizer
    events: list = []
    engine.subscribe(events.append)
    prompt = "BRUTUS:\nThere is a tide in the affairs of men,"
    engine.add_request("r0", prompt, SamplingParams(temperature=0, max_tokens=96))
    text = engine.run_until_done()["r0"].outputs[0].text
    emitted: dict[int, list[int]] = {}
    for e in events:
        if type(e).__name__ == "TokenEmitted":
            emitted.setdefault(e.step, []).append(e.token_id)
    table = Table(title=f"Greedy decoding after {prompt!r}, up to 4 proposals a step")
    for col in ("step", "proposed: accepted, rejected", "then the model's own", "emitted"):
        table.add_column(col)
    shown = 0
    for e in events:
        if type(e).__name__ != "SpecTokensVerified" or shown == 12:
            continue
        shown += 1
        proposed = Text()
        for i, t in enumerate(e.proposed):
            style = "green" if i < e.num_accepted else "red strike"
            proposed.append(_shown(tok.decode([t])), style=style)
            proposed.append(" ")
        last = emitted[e.step][-1]
        word = "bonus" if e.num_accepted == len(e.proposed) else "correction"
        table.add_row(
            str(e.step),
            proposed,
            Text(f"{_shown(tok.decode([last]))} ({word})", style="bold"),
            str(len(emitted[e.step])),
        )
    console.print(table)
    stats = engine.stats.spec_decoding
    console.print(
        "Each row is one forward pass (␣ is a space, ⏎ a new line). The proposals are the "
        "tokens that followed the last 2 to 5 tokens (the longest that match) where they last "
        f"appeared before. Over the whole request: {stats.num_draft_tokens} "
        f"proposed, {stats.num_accepted_tokens} accepted ({stats.acceptance_rate:.0%}), "
        f"{stats.mean_accepted_length:.2f} tokens per verifying step."
    )
    console.print(Text(f"The text: {text[:160]!r}...", style="dim"))

    section(console, "2. The same requests, with and without speculation")
    arrivals = make_workload("repeats")
    table = Table(title="8 lines of Shakespeare, 96 greedy tokens each")
    for col in ("", "steps", "tokens through the model", "acceptance", "tokens per verifying step"):
        table.add_column(col, justify="right")
    outputs = {}
    for label, options in (("without", {}), ("with", {"speculative_config": SPEC})):
        engine = make_engine(**options)
        events = []
        engine.subscribe(events.append)
        for a in arrivals:
            engine.add_request(
                a.request_id,
                a.prompt,
                SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True),
            )
        outputs[label] = {r: o.outputs[0].token_ids for r, o in engine.run_until_done().items()}
        steps = [e for e in events if type(e).__name__ == "StepSummary"]
        s = engine.stats.spec_decoding
        table.add_row(
            f"{label} speculation",
            str(len(steps)),
            f"{sum(sum(e.scheduled.values()) for e in steps):,}",
            f"{s.acceptance_rate:.0%}" if s.num_drafts else "-",
            f"{s.mean_accepted_length:.2f}" if s.num_drafts else "-",
        )
    console.print(table)
    same = outputs["with"] == outputs["without"]
    console.print(
        f"Identical outputs: {same}. Fewer steps, each computing more tokens (the rejected "
        "proposals' too): whether that is faster depends on what a step with more tokens in it "
        "costs; `nanovllm bench --speculative-config` measures it."
    )

    section(console, "3. Rejection sampling keeps the target's distribution")
    from nanovllm.executor.rejection_sampler import verify_random

    p = torch.tensor([[0.50, 0.25, 0.15, 0.10, 0.00], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([[0.10, 0.10, 0.20, 0.30, 0.30]])
    trials = 20_000
    drafts = torch.multinomial(
        q[0], trials, replacement=True, generator=torch.Generator().manual_seed(1)
    )
    generator = torch.Generator().manual_seed(0)
    first = torch.zeros(5)
    for x in drafts.tolist():
        first[verify_random(p, [x], generator, q)[0]] += 1
    table = Table(title=f"The first token of {trials:,} verifications of one proposal x ~ q")
    for col in ("token", "target p", "draft q", "emitted", ""):
        table.add_column(col, justify="right")
    for t in range(5):
        f = float(first[t]) / trials
        table.add_row(
            str(t),
            f"{float(p[0, t]):.2f}",
            f"{float(q[0, t]):.2f}",
            f"{f:.3f}",
            "█" * round(f * 40),
        )
    console.print(table)
    console.print(
        "Accepting x with probability min(1, p(x)/q(x)) and otherwise drawing from max(0, p - q) "
        "gives exactly p, even for token 4, which the draft proposes 30% of the time and the "
        "target never emits."
    )


if __name__ == "__main__":
    run(Console())
