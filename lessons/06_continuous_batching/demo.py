"""Lesson 06 demo: continuous batching in the real engine, then static vs continuous, plotted.

1. The engine serves 6 requests of different lengths with 3 seats: one line per step shows who
   prefills (P), decodes (d), waits (.) or is done.
2. The same 32-request workload through static batching and through the engine's scheduler
   (no model needed: the scheduler only counts tokens). A plot of both is saved as a PNG.

Run it: `nanovllm lesson 6 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import random
import string

from rich.console import Console
from rich.table import Table

from nanovllm.lessons.demo_support import figures_dir, make_engine, section


def engine_timeline(console: Console) -> None:
    from nanovllm import SamplingParams
    from nanovllm.events import RequestFinished, StepSummary

    engine = make_engine(max_num_seqs=3)
    lengths = [5, 14, 4, 9, 3, 7]
    names = string.ascii_uppercase[: len(lengths)]
    for name, n in zip(names, lengths):
        engine.add_request(
            name, "ROMEO: But soft", SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        )
    steps: list[StepSummary] = []
    finished_at: dict[str, int] = {}

    def listen(event) -> None:
        if isinstance(event, StepSummary):
            steps.append(event)
        elif isinstance(event, RequestFinished):
            finished_at[event.request_id] = event.step

    engine.subscribe(listen)
    engine.run_until_done()

    console.print(f"max_num_seqs=3; output lengths {dict(zip(names, lengths))}")
    console.print("  step  " + " ".join(names) + "   running waiting")
    for s in steps:
        cells = []
        for name in names:
            if name in s.scheduled:
                cells.append("[cyan]P[/]" if s.scheduled[name] > 1 else "[green]d[/]")
            elif finished_at.get(name, 10**9) < s.step:
                cells.append(" ")
            else:
                cells.append("[dim].[/]")
        console.print(
            f"  {s.step:>4}  " + " ".join(cells) + f"   {s.num_running:>7} {s.num_waiting:>7}"
        )
    console.print(
        "  Each time a request finishes, the next waiting one is prefilled in the very next step, "
        "alongside the others' decodes."
    )


def simulate_engine(workload: list[tuple[int, int]], max_num_seqs: int, budget: int) -> list[int]:
    """Run the engine's Scheduler (no model: sampled tokens are dummies); running count per step."""
    from nanovllm.config import EngineConfig
    from nanovllm.core.kv_cache_manager import KVCacheManager
    from nanovllm.core.scheduler import Scheduler
    from nanovllm.events import EventBus
    from nanovllm.request import FinishReason, Request
    from nanovllm.sampling_params import SamplingParams

    config = EngineConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, enable_prefix_caching=False
    )
    kv = KVCacheManager(4096, config.block_size, enable_prefix_caching=False)
    scheduler = Scheduler(config, kv, EventBus())
    for i, (prompt, output) in enumerate(workload):
        request = Request(
            str(i), [0] * prompt, SamplingParams(), arrival_index=i, max_tokens=output
        )
        scheduler.add_request(request)
    running = []
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        running.append(len(out.scheduled))
        for request, _ in scheduler.update_from_output(
            out, {s.request.request_id: [0] for s in out.scheduled}
        ):
            if request.num_output_tokens >= request.max_tokens:
                scheduler.finish_request(request, FinishReason.LENGTH)
    return running


def simulate_static(workload: list[tuple[int, int]], max_num_seqs: int, budget: int) -> list[int]:
    """Static batching: a batch of up to max_num_seqs starts only when the last one is done."""
    queue = list(workload)
    running = []
    while queue:
        batch, tokens = [], 0
        while queue and len(batch) < max_num_seqs and tokens + queue[0][0] <= budget:
            tokens += queue[0][0]
            batch.append(queue.pop(0)[1])
        for step in range(max(batch)):  # step 0 prefills (and samples the first token)
            running.append(sum(1 for n in batch if n > step))
    return running


def plot(static: list[int], continuous: list[int], max_num_seqs: int) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(
        range(1, len(static) + 1),
        static,
        label=f"static batching ({len(static)} steps)",
        color="tab:red",
        lw=1.2,
    )
    ax.plot(
        range(1, len(continuous) + 1),
        continuous,
        label=f"continuous batching ({len(continuous)} steps)",
        color="tab:blue",
        lw=1.2,
    )
    ax.axhline(max_num_seqs, color="grey", ls=":", lw=1, label=f"max_num_seqs = {max_num_seqs}")
    ax.set_ylim(0, max_num_seqs + 3)  # room for the legend above the lines
    ax.set_xlabel("engine step")
    ax.set_ylabel("requests computing in the step")
    ax.set_title("The same 32 requests: batch occupancy per step")
    ax.legend(loc="upper right")
    fig.tight_layout()
    path = figures_dir() / "06_static_vs_continuous.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def run(console: Console) -> None:
    section(console, "1. The engine, step by step")
    engine_timeline(console)

    section(console, "2. Static vs continuous batching on the same workload")
    rng = random.Random(0)
    # Mostly short replies, a few long ones: the mix that hurts static batching most.
    workload = [
        (rng.randint(16, 64), rng.choice([rng.randint(4, 30)] * 5 + [rng.randint(120, 200)]))
        for _ in range(32)
    ]
    max_num_seqs, budget = 8, 512
    static = simulate_static(workload, max_num_seqs, budget)
    continuous = simulate_engine(workload, max_num_seqs, budget)
    table = Table()
    table.add_column("")
    table.add_column("static", justify="right")
    table.add_column("continuous", justify="right")
    table.add_row("steps to serve all 32 requests", str(len(static)), str(len(continuous)))
    table.add_row(
        "mean requests per step",
        f"{sum(static) / len(static):.1f}",
        f"{sum(continuous) / len(continuous):.1f}",
    )
    table.add_row(
        "steps with fewer than 3 requests",
        str(sum(1 for n in static if n < 3)),
        str(sum(1 for n in continuous if n < 3)),
    )
    console.print(table)
    try:
        path = plot(static, continuous, max_num_seqs)
        console.print(f"Plot saved: [bold]{path}[/]")
    except ImportError:
        console.print("[yellow]matplotlib is not installed: no plot.[/]")
    console.print(
        "Static batching idles while a batch's longest reply finishes; continuous batching "
        "keeps every seat busy until the queue runs dry."
    )


if __name__ == "__main__":
    from nanovllm.lessons.demo_support import make_console

    run(make_console())
