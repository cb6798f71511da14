"""Lesson 17 demo: the router picks each token's experts, the dispatch groups tokens by expert.

On the demo model as a mixture of experts (`demo_support.moe_model_path`: Mixtral, 4 experts a
layer, 2 per token):

1. The router of layer 0 on a line's first tokens (their embeddings): the logits, the
   probabilities, the two chosen experts and their weights, renormalised as Mixtral does.
2. The dispatch of those tokens: the (token, slot) pairs sorted by expert, each expert's run.
3. A batch served by the engine, with every sparse layer counting its pairs per expert: how
   unevenly a step's work falls on the experts.

Run it: `nanovllm lesson 17 --demo` (or `python demo.py`).
"""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine, moe_model_path, section

LINE = "ROMEO: But, soft! what light through yonder window breaks?"
NUM_SHOWN = 6


def _routing(console: Console):
    import torch
    from safetensors.torch import load_file

    from nanovllm.models.loader import load_tokenizer
    from nanovllm.models.moe import select_experts, sort_by_expert

    path = moe_model_path()
    weights = load_file(str(path / "model.safetensors"))
    tokenizer = load_tokenizer(path)
    ids = tokenizer.encode(LINE)[:NUM_SHOWN]
    x = weights["model.embed_tokens.weight"][ids]  # [n, hidden]
    router = weights["model.layers.0.block_sparse_moe.gate.weight"]  # [E, hidden]
    logits = x @ router.T  # [n, E]
    topk_weights, topk_ids = select_experts(logits, 2, renormalize=True)
    probs = torch.softmax(logits, dim=-1)

    section(console, "1. The router: a softmax over every expert, the best 2, renormalised")
    table = Table()
    for col in ("token", "logits", "probabilities", "experts", "weights"):
        table.add_column(col)
    pieces = [tokenizer.decode([i]) for i in ids]
    for t, piece in enumerate(pieces):
        table.add_row(
            repr(piece),
            " ".join(f"{v:+.2f}" for v in logits[t].tolist()),
            " ".join(f"{v:.2f}" for v in probs[t].tolist()),
            str(topk_ids[t].tolist()),
            " ".join(f"{v:.2f}" for v in topk_weights[t].tolist()),
        )
    console.print(table)

    section(console, "2. The dispatch: the pairs sorted by expert, one matmul per expert")
    order, counts = sort_by_expert(topk_ids, router.shape[0])
    console.print(
        f"pairs' experts (pair p is token p // 2's slot p % 2): {topk_ids.flatten().tolist()}"
    )
    console.print(f"order {order.tolist()}, counts {counts.tolist()} (sum {int(counts.sum())})")
    table = Table()
    for col in ("expert", "its pairs", "its tokens", "rows of one matmul"):
        table.add_column(col)
    start = 0
    for e, count in enumerate(counts.tolist()):
        pairs = order[start : start + count].tolist()
        start += count
        tokens = [p // 2 for p in pairs]
        table.add_row(str(e), str(pairs), " ".join(repr(pieces[t]) for t in tokens), str(count))
    console.print(table)


def _loads(console: Console) -> None:
    from nanovllm import SamplingParams
    from nanovllm.engine.parts import EngineParts
    from nanovllm.lessons.plug_moe import your_moe_layers
    from nanovllm.models import moe

    per_call: list[list[int]] = []

    def counting(topk_ids, num_experts):
        order, counts = moe.sort_by_expert(topk_ids, num_experts)
        per_call.append(counts.tolist())
        return order, counts

    layers = SimpleNamespace(
        select_experts=moe.select_experts, sort_by_expert=counting, fused_experts=moe.fused_experts
    )
    engine = make_engine(model=str(moe_model_path()),
                         parts=EngineParts(model_layers=your_moe_layers(layers)))  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(("JULIET:", "HAMLET: To be, or not to be", "Enter the KING.")):
        engine.add_request(f"r{i}", prompt, params)
    rows = []
    while engine.has_unfinished_requests():
        before = len(per_call)
        engine.step()
        rows.append(per_call[before:])  # one count per sparse layer, in layer order
    section(console, "3. Where each step's work went: pairs per expert, layer 0 and layer 3")
    table = Table()
    for col in ("step", "tokens", "layer 0: experts 0-3", "layer 3: experts 0-3", "busiest / mean"):
        table.add_column(col)
    for step, counts in enumerate(rows, start=1):
        if not counts:
            continue
        first, last = counts[0], counts[-1]
        mean = sum(first) / len(first)
        table.add_row(
            str(step), str(sum(first) // 2), str(first), str(last), f"{max(first) / mean:.1f}"
        )
    console.print(table)
    console.print(
        "Each token is 2 pairs, so a step's pairs are twice its tokens. A router trained with a "
        "load-balancing loss spreads them evenly on average; step by step they are uneven, and "
        "the busiest expert sets the step's time when experts run side by side."
    )


def run(console: Console) -> None:
    _routing(console)
    _loads(console)


if __name__ == "__main__":
    run(Console(highlight=False))
