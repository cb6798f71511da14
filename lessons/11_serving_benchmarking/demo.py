"""Lesson 11 demo: a small benchmark of the engine, and what a streaming server sends.

1. The same 6 requests served with max_num_seqs = 1 (one at a time) and 6 (all batched): output
   throughput, and TTFT and inter-token latency percentiles from each token's arrival time.
2. The server-sent events `nanovllm serve` would stream for one of those replies.

Run it: `nanovllm lesson 11 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine, section

PROMPTS = ["ROMEO:", "JULIET:", "HAMLET:", "OTHELLO:", "MACBETH:", "PUCK:"]


def bench(max_num_seqs: int) -> dict:
    """Serve the prompts (all arriving at t=0); return wall time and per-request token times."""
    from nanovllm import SamplingParams
    from nanovllm.bench.records import RequestRecord

    engine = make_engine(max_num_seqs=max_num_seqs)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    engine.add_request("warmup", "A", SamplingParams(max_tokens=2))
    engine.run_until_done()
    times: dict[str, list[float]] = {str(i): [] for i in range(len(PROMPTS))}
    texts: dict[str, list[str]] = {rid: [] for rid in times}
    start = time.perf_counter()
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter() - start
            times[out.request_id].extend([now] * len(out.delta_token_ids))
            texts[out.request_id].append(out.delta_text)
    wall = time.perf_counter() - start
    return dict(
        wall=wall,
        records=[RequestRecord([0] * len(t), t, 0.0) for t in times.values()],
        texts=texts,
    )


def run(console: Console) -> None:
    from nanovllm.bench.stats import percentile
    from nanovllm.serve.sse import DONE, sse_data

    section(console, "1. Throughput against latency")
    table = Table()
    for col in ("max_num_seqs", "output tok/s", "TTFT p50", "TTFT p90", "ITL p50", "ITL p90"):
        table.add_column(col, justify="right")
    results = {}
    for seats in (1, len(PROMPTS)):
        r = bench(seats)
        results[seats] = r
        ttfts = [rec.ttft for rec in r["records"]]
        itls = [x for rec in r["records"] for x in rec.itls]
        tokens = sum(len(rec.token_times) for rec in r["records"])
        table.add_row(
            str(seats),
            f"{tokens / r['wall']:.0f}",
            *(f"{percentile(xs, q) * 1e3:.0f} ms" for xs in (ttfts, itls) for q in (50, 90)),
        )
    console.print(table)
    console.print(
        "One at a time, the last request waits for all the others: a huge TTFT p90. Batched, every "
        "request starts at once and the GPU (here, the CPU) does 6 tokens per step, at the cost of "
        "a somewhat slower step (ITL)."
    )

    section(console, "2. What the server streams")
    pieces = [p for p in results[len(PROMPTS)]["texts"]["0"] if p][:4]
    console.print('POST /v1/completions {"prompt": "ROMEO:", "stream": true} answers:\n')
    for piece in pieces:
        chunk = {"id": "cmpl-0", "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
        console.print(escape(sse_data(chunk)), end="")
    console.print("...\n" + escape(DONE), end="")
    console.print(
        "Try it: [bold]nanovllm serve[/], then [bold]curl -N localhost:8000/v1/completions "
        '-H \'Content-Type: application/json\' -d \'{"prompt": "ROMEO:", "stream": true}\'[/]'
    )


if __name__ == "__main__":
    run(Console())
