"""Lesson 10 demo: a next-token distribution under top-k and top-p, and text streaming out.

1. The model's 10 most likely next tokens after a prompt (from the engine's logprobs), and what
   top-k = 3 and top-p = 0.8 keep of them.
2. A string with accents and an emoji, fed token by token through the engine's incremental
   detokenizer: what each token adds to the stream.
3. Two seeded requests streaming at once through `engine.stream()`.

Run it: `nanovllm lesson 10 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import math

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine, section


def run(console: Console) -> None:
    from nanovllm import SamplingParams
    from nanovllm.engine.detokenizer import DetokenizerState, IncrementalDetokenizer
    from nanovllm.executor.sampler import apply_filters

    engine = make_engine()
    tok = engine.tokenizer

    section(console, "1. Filtering a distribution")
    prompt = "ROMEO: O, she doth teach the torches to"
    engine.add_request("probe", prompt, SamplingParams(temperature=0, max_tokens=1, logprobs=10))
    top = engine.run_until_done()["probe"].outputs[0].logprobs[0]
    ids = sorted(top, key=lambda t: -top[t].logprob)[:10]
    logits = torch.tensor([[top[t].logprob for t in ids]])  # log-probs work as logits
    keep_k = torch.isfinite(
        apply_filters(logits, torch.tensor([3]), torch.tensor([1.0]), torch.tensor([0.0]))
    )[0]
    keep_p = torch.isfinite(
        apply_filters(logits, torch.tensor([10]), torch.tensor([0.8]), torch.tensor([0.0]))
    )[0]
    table = Table(title=f"Next token after {prompt!r}")
    for col in ("token", "probability", "", "top-k 3", "top-p 0.8"):
        table.add_column(col)
    for i, t in enumerate(ids):
        p = math.exp(top[t].logprob)
        table.add_row(
            escape(repr(tok.decode([t]))),
            f"{p:.3f}",
            "█" * max(1, round(p * 40)),
            "kept" if keep_k[i] else "[dim]-[/]",
            "kept" if keep_p[i] else "[dim]-[/]",
        )
    console.print(table)
    console.print("top-k keeps a fixed number; top-p keeps as many as it takes to reach 80%.")

    section(console, "2. Streaming text, token by token")
    text = "Café naïve, ☕ à la mode."
    token_ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    state = DetokenizerState()
    rows = Table()
    for col in ("token", "piece", "decoded alone", "streamed now"):
        rows.add_column(col)
    for i in range(1, len(token_ids) + 1):
        delta = detok.step(state, token_ids[:i])
        piece = tok.convert_ids_to_tokens(token_ids[i - 1])
        alone = tok.decode(token_ids[i - 1 : i])
        rows.add_row(
            str(token_ids[i - 1]),
            escape(repr(piece)),
            escape(repr(alone)),
            escape(repr(delta)) if delta else "[dim](waits)[/]",
        )
    console.print(rows)
    console.print(f"Streamed text: {escape(repr(state.text))}. Nothing half-written was ever sent.")

    section(console, "3. Two requests streaming at once")
    for i, start in enumerate(["JULIET:", "HAMLET:"]):
        engine.add_request(
            f"s{i}", start, SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=24)
        )
    texts = {"s0": "JULIET:", "s1": "HAMLET:"}
    for out in engine.stream():
        texts[out.request_id] += out.delta_text
    for rid, t in texts.items():
        console.print(f"  {rid}: {escape(t)!s}")
    console.print("Seeded: run the demo again and the same text comes back, whatever the batch.")


if __name__ == "__main__":
    run(Console())
