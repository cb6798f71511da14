"""The end-of-run report: rich tables for people, one JSON document for machines.

Tables, per model: throughput and latency by engine (median and min-max over repeats, ratio to
nanovllm, TTFT and ITL percentiles, greedy agreement); KV memory; prefix caching; step
breakdown; the linear-layer floor; the issue's targets; and, with `--profile`, the functions
that take nanovllm's step time. The JSON is the suite's dict as it is (plus nothing), so every
figure in a table is in the JSON under the same name.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _f(x, fmt: str = ",.0f", missing: str = "-") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return format(x, fmt)


def _ms(x) -> str:
    return _f(None if x is None else 1000 * x, ",.1f")


def _pct(x) -> str:
    return _f(None if x is None else 100 * x, ".1f") + ("%" if x is not None else "")


def print_report(result: dict, console: Console) -> None:
    env = result["environment"]
    console.print(
        f"[bold]nanovllm bench[/]  torch {env['torch']}, transformers {env['transformers']}, "
        f"{env['torch_threads']} torch thread(s) of {env['cpu_count']} CPUs, fp32"
    )
    for model in result["models"]:
        _model_report(model, console)


def _model_report(m: dict, console: Console) -> None:
    info = m["model"]
    console.rule(f"[bold]{info['name']}[/]  {info['num_params'] / 1e6:.1f}M parameters")
    for note in m.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    w = m["workload"]
    console.print(
        f"workload: {w['description']} ({'greedy' if w['greedy'] else 'sampled'}, EOS ignored); "
        f"{w['output_tokens']:,} output tokens; max_model_len {m['max_model_len']}"
    )

    t = Table(title="Throughput and latency (median of repeats; latency pooled)")
    for col in ("engine", "out tok/s", "min-max", "nanovllm speedup", "TTFT p50/p90/p99 ms"):
        t.add_column(col, justify="right" if col != "engine" else "left")
    t.add_column("ITL p50/p90/p99 ms", justify="right")
    t.add_column("greedy agree", justify="right")
    for name, e in m["engines"].items():
        if "skipped" in e and not e.get("runs"):
            t.add_row(name, "skipped", "", "", "", "", e["skipped"][:60])
            continue
        if not e.get("runs"):
            continue
        tok = e["tok_s"]
        lat = e["latency"]
        agree = e.get("agreement")
        speed = e.get("nanovllm_speedup")
        t.add_row(
            name + (f" (bs {e['load']['batch_size']})" if "batch_size" in e["load"] else ""),
            _f(tok["median"]),
            f"{_f(tok['min'])}-{_f(tok['max'])}",
            f"{speed:.2f}x" if speed else "-",
            "/".join(_ms(lat["ttft"][k]) for k in ("p50", "p90", "p99")),
            "/".join(_ms(lat["itl"][k]) for k in ("p50", "p90", "p99")),
            _f(agree["tokens_pct"], ".1f") + "%" if agree else "-",
        )
    console.print(t)
    if "hf_static_calibration" in m:
        rates = ", ".join(f"bs {k}: {v:,.0f}" for k, v in m["hf_static_calibration"].items())
        console.print(f"hf-static batch sizes (tok/s on shortened outputs): {rates}")

    if "memory" in m:
        _memory_table(m["memory"], console)
    if "prefix" in m:
        _prefix_table(m["prefix"], console)
    if "overhead" in m:
        _overhead_table(m["overhead"], console)
    if "floor" in m:
        f = m["floor"]
        console.print(
            f"[bold]Ceiling[/]: linear layers alone for nanovllm's {f['num_steps']} steps "
            f"take {f['seconds']:.2f} s = {f['output_tokens_per_s']:,.0f} output tok/s; "
            f"nanovllm reaches {_pct(f.get('nanovllm_share'))} of it"
        )
    if "profile" in m:
        _profile_table(m["profile"], console)
    if "serve" in m:
        s = m["serve"]
        if "skipped" in s:
            console.print(f"--serve: {s['skipped']}")
        else:
            console.print(
                f"[bold]--serve[/] {s['url']}: {s['output_throughput']:,.0f} output tok/s, "
                f"TTFT p50 {_ms(s['ttft']['p50'])} ms, ITL p50 {_ms(s['itl']['p50'])} ms, "
                f"{s['num_errors']} errors"
            )
    _targets_table(m.get("targets", []), console)


def _memory_table(mem: dict, console: Console) -> None:
    t = Table(title="KV memory: paged (nanovllm) vs contiguous max_model_len reservation")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("internal fragmentation, over the run", _pct(mem["fragmentation_time_weighted"]))
    peak = mem.get("at_peak")
    if peak:
        t.add_row(
            f"at peak: slots allocated / holding KV ({peak['num_running']} running)",
            f"{peak['allocated_slots']:,} / {peak['filled_slots']:,} "
            f"({_pct(peak['fragmentation'])} empty)",
        )
        t.add_row(
            "same moment, contiguous reservation",
            f"{peak['contiguous_slots']:,} ({_pct(peak['contiguous_waste'])} empty; paged uses "
            f"{_pct(peak['paged_vs_contiguous'])} of it)",
        )
    full = mem["all_requests_at_full_length"]
    t.add_row(
        "whole workload at full length: paged / contiguous",
        f"{full['paged_slots']:,} / {full['contiguous_slots']:,} slots",
    )
    t.add_row(
        f"requests that fit in {mem['capacity_slots']:,} slots: paged / contiguous",
        f"{mem['fit_paged']:,} / {mem['fit_contiguous']:,} ({mem['fit_ratio']:.1f}x)",
    )
    t.add_row("peak concurrent requests measured", f"{mem['peak_running']}")
    console.print(t)


def _prefix_table(p: dict, console: Console) -> None:
    t = Table(title=f"Prefix caching: {p['workload']}")
    t.add_column("figure")
    t.add_column("with cache", justify="right")
    t.add_column("without", justify="right")
    t.add_row(
        "prompt tokens computed",
        f"{p['computed_with_cache']:,} of {p['prompt_tokens']:,}",
        f"{p['computed_without_cache']:,}",
    )
    t.add_row(
        "output tok/s (median)",
        _f(p["tok_s_with_cache"]["median"]),
        _f(p["tok_s_without_cache"]["median"]),
    )
    ratio = p["throughput_ratio"]
    t.add_row("throughput ratio", f"{ratio:.2f}x" if ratio else "-", "1.00x")
    console.print(t)


def _overhead_table(o: dict, console: Console) -> None:
    t = Table(title="nanovllm step time (share of wall time)")
    t.add_column("steps")
    for part in ("schedule", "prepare", "model", "sample", "other", "overhead", "ms/step"):
        t.add_column(part, justify="right")
    rows = [("all", o["all_steps"])]
    if o.get("at_full_concurrency"):
        rows.append((f"decode, {o['full_concurrency']} seqs", o["at_full_concurrency"]))
    for label, b in rows:
        s = b["share"]
        t.add_row(
            f"{label} ({b['num_steps']})",
            *(_pct(s[k]) for k in ("schedule", "prepare", "model", "sample", "other")),
            _pct(b["overhead_share"]),
            _f(b["mean_step_ms"], ".2f"),
        )
    console.print(t)


def _profile_table(p: dict, console: Console, rows: int = 15) -> None:
    groups = ", ".join(f"{k} {_pct(v)}" for k, v in p["groups"].items())
    console.print(f"[bold]cProfile[/] ({p['num_steps']} steps): {groups}")
    t = Table(title="top functions by own time")
    for col in ("function", "calls", "own s", "share", "cum s"):
        t.add_column(col, justify="left" if col == "function" else "right")
    for r in p["top"][:rows]:
        t.add_row(
            r["function"][-70:],
            f"{r['ncalls']:,}",
            f"{r['tottime_s']:.3f}",
            _pct(r["share"]),
            f"{r['cumtime_s']:.3f}",
        )
    console.print(t)


def _targets_table(targets: list[dict], console: Console) -> None:
    if not targets:
        return
    t = Table(title="Targets (issue)")
    t.add_column("target")
    t.add_column("measured", justify="right")
    t.add_column("goal", justify="right")
    t.add_column("met")
    for c in targets:
        if c["unit"] == "x":
            value = "-" if c["value"] is None else f"{c['value']:.2f}x"
            goal = f">= {c['goal']:g}x"
        else:
            value, goal = _pct(c["value"]), f"<= {_pct(c['goal'])}"
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: "n/a"}[c["met"]]
        t.add_row(c["target"], value, goal, met)
    console.print(t)


def write_json(result: dict, destination: str) -> None:
    text = json.dumps(result, indent=1, default=str)
    if destination == "-":
        print(text)
    else:
        Path(destination).write_text(text + "\n")
