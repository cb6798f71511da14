"""Lesson 14 demo: one model over two ranks.

1. A small layer cut over 2 ranks both ways, by the engine's own `ColumnParallelLinear` and
   `RowParallelLinear` built as each rank (`as_tp_rank`, no process group): which entries of W
   each rank holds, and the ranks' results put back together, equal to the uncut layer.
2. Where the demo model's attention heads go at 1, 2 and 4 ranks (KV heads copied when there
   are more ranks than KV heads), and each rank's share of the weights and of a KV block.
3. The real engine on 2 ranks (rank 1 in a worker process, gloo between them): the same greedy
   text as on 1 rank, each rank's forward time per step, the collectives rank 0 calls in one
   decode step, and what a decode step costs on 1 rank and on 2.

Run it: `nanovllm lesson 14 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import statistics
from collections import Counter

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nanovllm.lessons.demo_support import demo_model_path, make_engine, section

RANK_STYLES = ("bold cyan", "bold magenta", "bold green", "bold yellow")
PROMPTS = (
    "ROMEO:\nBut, soft! what light through yonder window breaks?",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
    "HAMLET:\nTo be, or not to be,",
    "PORTIA:\nThe quality of mercy is not strain'd,",
)


def _both_cuts(weight: torch.Tensor, n: int) -> Text:
    """W twice, side by side: cut by rows (column-parallel) and by columns (row-parallel), each
    entry in the colour of the rank that holds it, and a bar between the ranks' parts (so the
    cuts read without colour too)."""
    rows, cols = weight.shape
    rows_per_rank, cols_per_rank = rows // n, cols // n
    width = max(len(f"{v:g}") for v in weight.flatten().tolist()) + 1
    left = 7 + cols * width
    text = Text(f"{'column-parallel: by rows':<{left + 6}}row-parallel: by columns\n", "bold")
    for i, row in enumerate(weight.tolist()):
        rank = i // rows_per_rank
        text.append(f"rank {rank} ", RANK_STYLES[rank])
        for v in row:
            text.append(f"{v:>{width}g}", RANK_STYLES[rank])
        text.append(" " * 6)
        for j, v in enumerate(row):
            if j and j % cols_per_rank == 0:
                text.append(" │")
            text.append(f"{v:>{width}g}", RANK_STYLES[j // cols_per_rank])
        text.append("\n")
    text.append(" " * (left + 6))
    for rank in range(n):
        text.append(f"{'rank ' + str(rank):^{cols_per_rank * width + 1}}", RANK_STYLES[rank])
    return text


def _cut_a_layer(console: Console) -> None:
    from nanovllm.distributed import as_tp_rank
    from nanovllm.models.linear import ColumnParallelLinear, RowParallelLinear

    out_size, in_size, n = 4, 6, 2
    w = torch.arange(out_size * in_size, dtype=torch.float32).view(out_size, in_size) - 8
    x = torch.tensor([[1.0, 0, 2, -1, 0, 1], [0, 1, 1, 0, -2, 3]])  # 2 tokens
    want = F.linear(x, w)
    pieces, partials = [], []
    for rank in range(n):
        with as_tp_rank(rank, n):
            column = ColumnParallelLinear(in_size, out_size)
            row = RowParallelLinear(in_size, out_size)
        column.weight_loader(column.weight, w)  # keeps rows [rank * 2, rank * 2 + 2)
        row.weight_loader(row.weight, w)  # keeps columns [rank * 3, rank * 3 + 3)
        pieces.append(F.linear(x, column.weight))  # [2 tokens, 2 features]
        x_rank = x[:, rank * in_size // n : (rank + 1) * in_size // n]
        partials.append(F.linear(x_rank, row.weight))  # [2 tokens, 4 features], partial
    console.print(_both_cuts(w, n))
    gathered = torch.cat(pieces, dim=-1)
    summed = partials[0] + partials[1]

    def ints(t: torch.Tensor) -> list:
        return t.int().tolist()

    console.print(
        f"x Wᵀ of 2 tokens (x = {ints(x)}): {ints(want)}\n"
        f"column-parallel, the ranks' 2 output features each, side by side: {ints(gathered)} "
        f"(equal: {torch.equal(gathered, want)})\n"
        f"row-parallel, rank 0's partial {ints(partials[0])} + rank 1's {ints(partials[1])} "
        f"= {ints(summed)} (equal: {torch.equal(summed, want)})"
    )


def _heads_and_shares(console: Console) -> None:
    from nanovllm.distributed import as_tp_rank
    from nanovllm.executor.memory import kv_bytes_per_block
    from nanovllm.models.linear import QKVParallelLinear
    from nanovllm.models.llama import CausalLM
    from nanovllm.models.loader import load_model_args
    from nanovllm.models.model_layers import ModelLayers

    _, args = load_model_args(demo_model_path())
    heads, kv = args.num_attention_heads, args.num_key_value_heads
    table = Table(
        title=f"The demo model ({heads} query heads, {kv} KV heads, {args.num_hidden_layers} "
        "layers) cut over N ranks; a KV block holds 16 tokens"
    )
    for col in ("N", "rank", "query heads", "KV heads", "parameters", "KV block"):
        table.add_column(col, justify="right")
    for tp in (1, 2, 4):
        if heads % tp or (kv % tp and tp % kv):
            continue
        block = kv_bytes_per_block(args, 16, torch.float32, tp)
        for rank in range(tp):
            with as_tp_rank(rank, tp), torch.device("meta"):  # shapes only, no memory
                qkv = QKVParallelLinear(args.hidden_size, args.head_dim, heads, kv)
                model = CausalLM(args, ModelLayers())
            first_kv = rank // qkv.num_kv_head_replicas * qkv.num_kv_heads
            q_heads = range(rank * qkv.num_heads, (rank + 1) * qkv.num_heads)
            kv_heads = range(first_kv, first_kv + qkv.num_kv_heads)
            copies = f" ({qkv.num_kv_head_replicas} copies)" if tp > kv else ""
            table.add_row(
                str(tp) if rank == 0 else "",
                str(rank),
                " ".join(map(str, q_heads)),
                " ".join(map(str, kv_heads)) + copies,
                f"{sum(p.numel() for p in model.parameters()):,}",
                f"{block / 1024:.0f} KiB",
            )
    console.print(table)
    console.print(
        "Every linear layer and the vocabulary are cut; the norms are whole on every rank. With "
        f"more ranks than KV heads, a rank still holds a whole KV head: at N = 4 each of the {kv} "
        "is copied on two ranks, and a rank's KV block stops shrinking."
    )


def _collectives(prof: torch.profiler.profile) -> tuple[Counter, list[float]]:
    """The collectives this process (rank 0) called while `prof` recorded, counted by
    c10d's op (`allreduce`, `allgather`, `broadcast`, `gather`: the same whatever the backend),
    and each all-reduce's seconds as gloo ran it. Each rank makes the same calls: they meet in
    them."""
    events = prof.events()
    counts = Counter(
        e.name.removeprefix("c10d::").rstrip("_") for e in events if e.name.startswith("c10d::")
    )
    times = [e.cpu_time_total / 1e6 for e in events if e.name == "gloo:all_reduce"]
    return counts, times


def _decode_steps(engine, max_tokens: int) -> tuple[dict[str, str], list]:
    """Serve the 4 prompts greedily; their texts and the engine's step summaries."""
    from nanovllm import SamplingParams

    summaries: list = []
    engine.subscribe(lambda e: summaries.append(e) if type(e).__name__ == "StepSummary" else None)
    for i, prompt in enumerate(PROMPTS):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params)
    outputs = engine.run_until_done()
    return {rid: out.outputs[0].text for rid, out in outputs.items()}, summaries


def _median_decode_ms(summaries: list) -> float:
    decodes = [s.forward_time for s in summaries if s.num_prefill_tokens == 0]
    return statistics.median(decodes) * 1e3


def _two_ranks(console: Console) -> None:
    console.print("Starting the engine on 1 rank, then on 2 (rank 1 in a worker process)...")
    one = make_engine()
    texts_one, steps_one = _decode_steps(one, 24)
    two = make_engine(tensor_parallel_size=2)
    try:
        texts_two, steps_two = _decode_steps(two, 24)
        # One more decode step of 4 requests, counting the messages rank 0 takes part in.
        from nanovllm import SamplingParams

        for i, prompt in enumerate(PROMPTS):
            two.add_request(f"c{i}", prompt, SamplingParams(temperature=0, max_tokens=3))
        two.step()  # the prefill
        # Recorded by torch's profiler (nothing of torch.distributed's is replaced).
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            two.step()  # a decode step of 4 requests
        counts, all_reduce_times = _collectives(prof)
        two.run_until_done()
    finally:
        two.shutdown()

    console.print(
        f"The same greedy text on 1 and on 2 ranks: {texts_one == texts_two}. "
        f"r0: {escape(repr(texts_two['r0'][:60]))}..."
    )
    table = Table(title="Each rank's forward pass, step by step, on 2 ranks")
    for col in ("step", "tokens", "rank 0", "rank 1", "the step's forward_time"):
        table.add_column(col, justify="right")
    for s in steps_two[:5]:
        table.add_row(
            str(s.step),
            f"{s.num_prefill_tokens} prefill"
            if s.num_prefill_tokens
            else f"{s.num_decode_tokens} decode",
            *(f"{t * 1e3:.1f} ms" for t in s.rank_forward_times),
            f"{s.forward_time * 1e3:.1f} ms",
        )
    console.print(table)
    console.print(
        "rank 0, rank 1: each rank's own forward pass, its waits in the all-reduces included. "
        "forward_time: rank 0's, from preparing the step's inputs and sending them to the "
        "logits."
    )

    layers = two.model_args.num_hidden_layers
    console.print(
        f"One decode step, as rank 0 calls them (torch's profiler counts them): "
        f"{counts['allreduce']} all-reduces (2 per layer for {layers} layers, and the "
        "embedding's) and an all-gather (the logits) in the forward pass; "
        f"{counts['broadcast']} broadcasts from rank 0 (two objects, each its length, then its "
        "bytes: the step's inputs, and the call that asks every rank for its forward time); "
        f"and another all-gather ({counts['allgather']} in all: the sizes of the ranks' times) "
        f"and {counts['gather']} gather of those times (the engine asks for them only when "
        "someone listens to its events, as this demo does). An all-reduce took "
        f"{statistics.median(all_reduce_times) * 1e3:.2f} ms (median)."
    )
    one_ms, two_ms = _median_decode_ms(steps_one), _median_decode_ms(steps_two)
    console.print(
        f"A decode step of 4 requests (median): {one_ms:.1f} ms on 1 rank, {two_ms:.1f} ms on 2 "
        f"({two_ms / one_ms:.1f}x). Two processes on the same CPU cores gain little from "
        "cutting the arithmetic and pay for every message; GPUs, each reading its own slice "
        "of the weights from its own memory and talking over NVLink, are what it is for."
    )


def run(console: Console) -> None:
    section(console, "1. One layer, cut over 2 ranks both ways")
    _cut_a_layer(console)
    section(console, "2. Where the heads go")
    _heads_and_shares(console)
    section(console, "3. The real engine on 2 ranks")
    _two_ranks(console)


if __name__ == "__main__":
    run(Console())
