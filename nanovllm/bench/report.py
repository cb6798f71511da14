"""The end-of-run report: rich tables for people, one JSON document for machines.

Per model: the headline table (output tok/s by engine, nanovllm / engine, share of the
roofline's ceiling, TTFT and ITL percentiles, greedy agreement), the roofline's inputs, then
nanovllm's own figures. The JSON is the suite's dict as it is: every figure printed is in it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _f(x, fmt: str = ",.0f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ms(seconds: float) -> str:
    return _f(1000 * seconds, ",.1f")


def _tok_s_range(summary: dict) -> str:
    """A setup's output tok/s over its runs: median (min-max)."""
    t = summary["tok_s"]
    return f"{_f(t['median'])} ({_f(t['min'])}-{_f(t['max'])})"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms3(p: dict) -> str:
    """p50/p90/p99 in ms: one decimal below 100 ms, none above."""
    ms = [1000 * p[k] for k in ("p50", "p90", "p99")]
    return "/".join(_f(x, ",.1f" if x < 100 else ",.0f") for x in ms)


def _si(x: float, unit: str) -> str:
    """3 significant digits with a k/M/G/T prefix: 52.3 MFLOP, 11.2 GB/s."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _table(console: Console, title: str, columns: list[str], rows: list[list[str]]) -> None:
    """First column left-aligned (labels), the others right-aligned (figures)."""
    t = Table(title=title)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    console.print(t)


def print_report(result: dict, console: Console) -> None:
    env = result["environment"]
    console.print(
        f"[bold]nanovllm bench[/]  torch {env['torch']}, transformers {env['transformers']}, fp32, "
        f"{env['threads']} thread(s) of {env['cpu_count']} CPUs, load average "
        f"{env['load_average']:.1f} at start"
    )
    for m in result["models"]:
        _model(m, result["config"]["repeats"], console)


def _paired(ratios: dict) -> str:
    """nanovllm / this repeat by repeat: "median (min-max)"."""
    return f"{ratios['median']:.2f}x ({ratios['min']:.2f}-{ratios['max']:.2f})"


def _model(m: dict, repeats: int, console: Console) -> None:
    s, r, w, engines = m["model"], m["roofline"], m["workload"], m["engines"]
    console.rule(
        f"[bold]{s['name']}[/]  {(r['layer_params'] + r['lm_head_params']) / 1e6:.2f}M matmul "
        f"parameters: {s['layers']} layers, hidden {s['hidden']}, {s['heads']}:{s['kv_heads']} "
        f"heads of {s['head_dim']}, vocab {s['vocab']}"
    )
    console.print(
        f"workload: {w['description']}; {'greedy' if w['greedy'] else 'sampled'}, EOS ignored; "
        f"{w['prompt_tokens']:,} prompt + {w['output_tokens']:,} output tokens; fp32, "
        f"{m['threads']} thread(s); median of {repeats} interleaved repeats"
    )
    rows = []
    for name, e in engines.items():
        if "tok_s" not in e:
            rows.append([name, "skipped"])
            continue
        tok, agree, ratio = e["tok_s"], e["agreement"], e["nanovllm_over_this"]
        rows.append([
            name + (f" (bs {e['batch_size']})" if "batch_size" in e else ""),
            _f(tok["median"]),
            f"{_f(tok['min'])}-{_f(tok['max'])}",
            f"{ratio:.2f}x" if ratio else "-",
            _pct(e["roofline_share"]),
            _ms3(e["latency"]["ttft"]),
            _ms3(e["latency"]["itl"]),
            f"{agree['tokens_pct']:.1f}%" if agree else "-",
        ])  # fmt: skip
    columns = ["engine", "out tok/s", "min-max", "nanovllm / this", "of roofline"]
    columns += ["TTFT p50/90/99 ms", "ITL p50/90/99 ms", "greedy agree"]
    _table(console, "Output tokens/s, side by side (latency pooled over repeats)", columns, rows)
    paired = [
        f"{name} {_paired(e['paired_ratios'])}"
        for name, e in engines.items()
        if name != "nanovllm" and e.get("paired_ratios") and e["paired_ratios"]["n"]
    ]
    if paired:
        console.print("nanovllm / this, repeat by repeat, median (min-max): " + ", ".join(paired))
    for name, e in engines.items():
        if "skipped" in e:
            console.print(f"[yellow]{name} skipped[/]: {e['skipped']}")
    for name, e in engines.items():  # how each engine was configured, and what it preempted
        if (configuration := e.get("load", {}).get("configuration")) is not None:
            preempted = e.get("num_preemptions")
            counted = f"; {preempted} preemptions in the first run" if preempted is not None else ""
            console.print(f"{name}: {configuration}{counted}")
    for name, e in engines.items():
        if (compile_s := e.get("load", {}).get("compile_s")) is not None:
            console.print(
                f"{name}: torch.compile took {compile_s:.1f} s at start-up (load "
                f"{e['load']['load_s']:.1f} s in all; nanovllm's load "
                f"{engines['nanovllm']['load']['load_s']:.1f} s)"
            )
    for name, e in engines.items():  # a peer run in its own configuration says which
        if (configuration := e.get("load", {}).get("configuration")) is not None:
            console.print(f"{name}: {configuration}")
    if "calibration" in engines.get("hf-static", {}):
        rates = engines["hf-static"]["calibration"].items()
        console.print(
            "hf-static batch sizes (tok/s, outputs cut to a quarter): "
            + ", ".join(f"{k}: {_f(v)}" for k, v in rates)
        )

    rates = ", ".join(
        f"{_si(v, 'FLOP/s')} at {k} rows" for k, v in r["matmul_flops_by_rows"].items()
    )
    console.print(
        f"[bold]Roofline[/], rates measured at start-up: matmul {_si(r['matmul_flops'], 'FLOP/s')} "
        f"(fp32, the model's weight shapes: {rates}); copy {_si(r['copy_bytes_per_s'], 'B/s')} "
        f"(read + written)\n  {_si(r['weight_flops'], 'FLOP')} of weight matmuls "
        f"({r['forwarded_tokens']:,} tokens forwarded) = {r['compute_s']:.3g} s, + "
        f"{_si(r['kv_bytes_read'], 'B')} of K/V read by decode attention = {r['memory_s']:.3g} s"
        f"\n  floor {r['floor_s']:.3g} s for {r['output_tokens']:,} output tokens: ceiling "
        f"{_f(r['ceiling_tok_s'])} output tok/s ('of roofline' above is an engine's share of it)"
    )

    if mem := m.get("memory"):
        alloc, filled = mem["peak_allocated_slots"], mem["peak_filled_slots"]
        rows = [
            ["internal fragmentation over the run (empty / allocated slot-steps)", _pct(mem["fragmentation"])],
            [f"at peak ({mem['peak_running']} running): slots allocated / holding KV",
             f"{alloc:,} / {filled:,} ({_pct(1 - filled / alloc)} empty)"],
            ["same moment, contiguous reservation", f"{mem['peak_contiguous_slots']:,} slots"],
            [f"requests that fit in {mem['capacity_slots']:,} slots: paged / contiguous",
             f"{mem['fit_paged']:,} / {mem['fit_contiguous']:,}"],
        ]  # fmt: skip
        title = f"nanovllm KV memory: paged blocks vs reserving max_model_len={m['max_model_len']}"
        _table(console, title, ["figure", "value"], rows)
    if sp := m.get("speculation"):
        _speculation(sp, console)
    if p := m.get("prefix"):
        rows = [
            ["prompt tokens computed", f"{p['computed_with_cache']:,} of {p['prompt_tokens']:,}",
             f"{p['computed_without_cache']:,}"],
            ["output tok/s (median)", _f(p["tok_s_with_cache"]["median"]),
             _f(p["tok_s_without_cache"]["median"])],
            ["speed-up", f"{p['speedup']:.2f}x", "1.00x"],
        ]  # fmt: skip
        if p["agreement"]:
            rows.append(["greedy agreement", f"{p['agreement']['tokens_pct']:.1f}%", ""])
        _table(console, f"Prefix caching: {p['workload']}", ["figure", "with", "without"], rows)
    if o := m.get("overhead"):
        parts = ["schedule", "prepare", "model", "sample", "other"]
        rows = []
        full = f"decode, {o['full_concurrency']} seqs"
        breakdowns = [("all", o["all_steps"]), (full, o["at_full_concurrency"])]
        if c := engines.get("nanovllm-compiled", {}).get("overhead"):
            breakdowns += [("compiled: all", c["all_steps"])]
            breakdowns += [(f"compiled: {full}", c["at_full_concurrency"])]
        for label, b in breakdowns:
            if b:
                shares = [_pct(b["share"][k]) for k in parts]
                label = f"{label} ({b['num_steps']})"
                rows.append(
                    [label, *shares, _pct(b["overhead_share"]), _f(b["mean_step_ms"], ".2f")]
                )
        title = "nanovllm step time (share of wall time; overhead = all but the model)"
        _table(console, title, ["steps", *parts, "overhead", "ms/step"], rows)
    if p := m.get("profile"):
        groups = ", ".join(f"{k} {_pct(v)}" for k, v in p["groups"].items())
        console.print(f"[bold]cProfile[/]: {groups}")
        rows = [
            [r["function"][-70:], f"{r['ncalls']:,}", f"{r['own_s']:.3f}", _pct(r["share"]),
             f"{r['cum_s']:.3f}"]
            for r in p["top"]
        ]  # fmt: skip
        _table(
            console,
            "top functions by own time",
            ["function", "calls", "own s", "share", "cum s"],
            rows,
        )
    if v := m.get("serve"):
        console.print(
            f"[bold]--serve[/] {v['url']}: {_f(v['output_throughput'])} output tok/s, "
            f"TTFT p50 {_f(1000 * v['ttft']['p50'], '.1f')} ms, "
            f"ITL p50 {_f(1000 * v['itl']['p50'], '.1f')} ms, {v['num_errors']} errors"
        )


def _speculation(sp: dict, console: Console) -> None:
    on, off = sp["with"], sp["without"]

    def tok_s(side: dict) -> str:
        t = side["tok_s"]
        return f"{_f(t['median'])} ({_f(t['min'])}-{_f(t['max'])})"

    ratio = f"{sp['steps_ratio']:.2f}x" if sp["steps_ratio"] else "-"
    speedup = f"{sp['speedup']:.2f}x" if sp["speedup"] else "-"
    rows = [
        ["steps", f"{_f(on['steps'])}", f"{_f(off['steps'])}", ratio],
        ["steps per output token", _f(on["steps_per_output_token"], ".4f"),
         _f(off["steps_per_output_token"], ".4f"), ratio],
        ["output tok/s, median (min-max)", tok_s(on), tok_s(off), speedup],
    ]  # fmt: skip
    if sp["agreement"]:
        rows.append(["greedy agreement", f"{sp['agreement']['tokens_pct']:.1f}%", "", ""])
    config = ", ".join(f"{k}={v}" for k, v in sp["speculative_config"].items())
    title = f"Speculative decoding ({config}): with vs without, interleaved"
    _table(console, title, ["figure", "with", "without", "with / without"], rows)
    console.print(
        f"  {sp['num_draft_tokens']:,} tokens proposed in {sp['num_drafts']:,} verifications, "
        f"{sp['num_accepted_tokens']:,} accepted: acceptance rate "
        f"{_pct(sp['acceptance_rate'])}, mean accepted length {sp['mean_accepted_length']:.2f} "
        "tokens per verifying step (all repeats)"
    )


def write_json(result: dict, destination: str) -> None:
    text = json.dumps(result, indent=1, default=str)
    if destination == "-":
        print(text)
    else:
        Path(destination).write_text(text + "\n")
