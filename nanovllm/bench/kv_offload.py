"""A KV connector, measured: multi-turn chats through nanovllm without and with it, side by side.

`nanovllm bench --multi-turn --kv-transfer-config JSON` loads nanovllm twice in one process, the
same model and sizes: `nanovllm-no-kv-transfer` (no connector) and `nanovllm` (the connector
configured, e.g. the OffloadingConnector's host tier). Both are warmed up, then serve the same
conversations (multi_turn.py) in interleaved repeats (without, with, without, with, ...), each
run on an idle machine (quiet.py) and with empty caches, tier included. Per side:

- the prompt tokens sent, and where their KV came from: the device pool's prefix cache (local
  hits, `Scheduler.prefix_cache_hits`), the connector (external hits,
  `Scheduler.external_prefix_cache_hits`), or the model (the prefill tokens its steps ran);
  `RequestOutput.num_cached_tokens` summed over the requests, local and external together;
- TTFT p50/p99 (from when a turn was sent to its first token), pooled over the repeats, and
  output tok/s, the median over the repeats (with min-max);
- with / without, for each, and for output tok/s also repeat by repeat (the median of the
  pairs' ratios: a slow spell of a shared machine slows both runs of a pair).

Token counts are the first repeat's: the driver sends the same prompts in the same order in
every run (it never looks at the clock), so the counts repeat exactly. Greedy decoding is the
same with and without a connector (it only supplies KV the model would otherwise compute), so
every run's outputs, and with them the prompts built from them, are compared with the first
run without it, request by request.

Only the OffloadingConnector is measured: its tier is emptied with the prefix cache before every
run, while a SharedStorageConnector's files would serve a repeat the previous repeat's KV.

Unless `--num-kv-blocks` is given, the device pool holds `concurrency` conversations at their
longest and no more: the turns in flight fit, and the other conversations' blocks are evicted
while they wait for their next turn.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from rich.console import Console

from nanovllm.bench import quiet, stats
from nanovllm.bench.engines import EngineLimits, make_engine
from nanovllm.bench.models import resolve
from nanovllm.bench.multi_turn import MultiTurnWorkload, multi_turn_workload
from nanovllm.bench.records import EngineRun
from nanovllm.bench.report import _ms, _ratio, _table, _tok_s_range
from nanovllm.bench.suite import Progress

if TYPE_CHECKING:
    from nanovllm.bench.engine_nanovllm import NanovllmEngine

WITHOUT, WITH = "nanovllm-no-kv-transfer", "nanovllm"


def run(
    kv_transfer_config: dict,
    limits: EngineLimits,
    model: str = "embedded",
    max_model_len: int | None = None,
    num_conversations: int = 8,
    num_turns: int = 4,
    user_len: tuple[int, int] = (32, 64),
    answer_len: tuple[int, int] = (32, 64),
    concurrency: int = 2,
    repeats: int = 3,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Both sides, `repeats` times each, interleaved; the figures as a dict (module docstring).
    `limits.num_kv_blocks` None: room for `concurrency` conversations at their longest;
    `max_model_len` None: the model's."""
    progress = progress or Progress()
    if kv_transfer_config.get("kv_connector") != "OffloadingConnector":
        raise ValueError(
            "--multi-turn measures a store that every run starts empty: the "
            f"OffloadingConnector's host tier, not {kv_transfer_config.get('kv_connector')!r} "
            "(a SharedStorageConnector's files outlive the runs, so a repeat would find the "
            "previous one's KV)"
        )
    info = resolve(model)
    workload = multi_turn_workload(
        num_conversations, num_turns, user_len, answer_len, info.vocab_size, seed, concurrency
    )
    limits.max_model_len = min(max_model_len or info.max_position, info.max_position)
    if workload.max_seq_len > limits.max_model_len:
        raise ValueError(
            f"the conversations reach {workload.max_seq_len} tokens, more than "
            f"max_model_len={limits.max_model_len} of model {model!r}: fewer --num-turns or "
            "shorter --prompt-len/--output-len"
        )
    blocks_per_conversation = math.ceil(workload.max_seq_len / limits.block_size)
    if limits.num_kv_blocks is None:
        limits.num_kv_blocks = concurrency * blocks_per_conversation
    limits.kv_transfer_config = kv_transfer_config
    load_average = os.getloadavg()[0]

    engines = {}
    try:
        for name in (WITHOUT, WITH):
            progress.log(f"loading {name}")
            engines[name] = make_engine(name, info.path, limits)
            engines[name].load()
        warm = workload.head(min(2, num_conversations), min(2, num_turns), 4)
        for name, engine in engines.items():
            _timed(engine, warm, progress, f"warm-up {name}")
        runs: dict[str, list[EngineRun]] = {WITHOUT: [], WITH: []}
        for rep in range(repeats):
            for name, engine in engines.items():
                label = f"{name} ({rep + 1}/{repeats})"
                runs[name].append(_timed(engine, workload, progress, label))
                progress.log(f"{label}: {runs[name][-1].output_tokens_per_s:,.0f} output tok/s")
    finally:
        for engine in engines.values():
            engine.close()

    without, with_ = side(runs[WITHOUT]), side(runs[WITH])

    def ratio(key: str, *path: str) -> float | None:
        a, b = with_[key], without[key]
        for p in path:
            a, b = a[p], b[p]
        return a / b if b else None

    reference = runs[WITHOUT][0]
    every_run = runs[WITHOUT] + runs[WITH]
    return {
        "model": model,
        "kv_transfer_config": kv_transfer_config,
        "workload": {
            "description": workload.description,
            "requests": workload.num_requests,
            "output_tokens": workload.num_output_tokens,
            "prompt_tokens": workload.num_prompt_tokens,
            "reusable_tokens": workload.reusable_tokens(limits.block_size),
            "max_seq_len": workload.max_seq_len,
            # What all the conversations would hold at once, at their longest.
            "blocks_all_conversations": num_conversations * blocks_per_conversation,
        },
        "num_kv_blocks": limits.num_kv_blocks,
        "block_size": limits.block_size,
        "repeats": repeats,
        "threads": limits.threads,
        "cpu_count": os.cpu_count(),
        "load_average": {"start": load_average, "end": os.getloadavg()[0]},
        "without": without,
        "with": with_,
        "ratios": {
            "computed": ratio("computed"),
            "ttft_p50": ratio("ttft", "p50"),
            "ttft_p99": ratio("ttft", "p99"),
            "tok_s": ratio("tok_s", "median"),
            # The same ratio repeat by repeat: the two runs of a repeat ran back to back, so a
            # slow spell of a shared machine slows both sides of a pair.
            "paired_tok_s": stats.summary(
                [
                    a.output_tokens_per_s / b.output_tokens_per_s
                    for a, b in zip(runs[WITH], runs[WITHOUT])
                ]
            ),
        },
        "outputs_identical": all(same_outputs(reference, r) for r in every_run),
        "prompts_identical": all(
            r.extra["prompts"] == reference.extra["prompts"] for r in every_run
        ),
        "agreement": stats.agreement(reference, runs[WITH][0]),
    }


def _timed(
    engine: NanovllmEngine, workload: MultiTurnWorkload, progress: Progress, label: str
) -> EngineRun:
    quiet.wait_until_idle()  # (suite.py's _timed, for the conversations' driver)
    progress.start(label, workload.num_output_tokens)
    try:
        return engine.run_conversations(workload, progress.advance)
    finally:
        progress.done()


def same_outputs(a: EngineRun, b: EngineRun) -> bool:
    return [r.token_ids for r in a.records] == [r.token_ids for r in b.records]


def side(runs: list[EngineRun]) -> dict[str, Any]:
    """One side's figures: token counts from its first run, times over all of them."""
    first = runs[0]
    ttft = stats.latency(runs)["ttft"]
    return {
        "prompt_tokens": sum(map(len, first.extra["prompts"])),
        "local_hits": first.extra["prefix_cache_hits"],
        "external_hits": first.extra["external_prefix_cache_hits"],
        "computed": sum(s["num_prefill_tokens"] for s in first.extra["steps"]),
        "num_cached_tokens": sum(first.extra["num_cached_tokens"]),
        "num_preemptions": first.extra["num_preemptions"],
        "output_tokens": first.num_output_tokens,
        "ttft": {q: ttft[q] for q in ("p50", "p99")},
        "tok_s": stats.summary([r.output_tokens_per_s for r in runs]),
    }


def print_report(result: dict[str, Any], console: Console) -> None:
    w, on, off, r = result["workload"], result["with"], result["without"], result["ratios"]
    load = result["load_average"]
    console.print(
        f"[bold]nanovllm bench --multi-turn[/] on {result['model']}: {w['description']}; greedy, "
        f"EOS ignored; {w['requests']} requests, {w['output_tokens']:,} output tokens; "
        f"{result['threads'] or 'default'} thread(s) of {result['cpu_count']} CPUs, load "
        f"average {load['start']:.1f} at start, {load['end']:.1f} at end; median of "
        f"{result['repeats']} interleaved repeats"
    )
    console.print(
        f"device pool: {result['num_kv_blocks']} blocks of {result['block_size']} tokens; a "
        f"conversation reaches {w['max_seq_len']} tokens, all of them together "
        f"{w['blocks_all_conversations']} blocks; connector: {result['kv_transfer_config']}"
    )
    console.print(
        f"of {w['prompt_tokens']:,} prompt tokens, {w['reusable_tokens']:,} repeat the previous "
        "turn's full blocks: a cache that lost nothing would serve those"
    )

    rows = [
        ["prompt tokens sent", f"{off['prompt_tokens']:,}", f"{on['prompt_tokens']:,}", ""],
        ["  found in the device pool (local hits)", f"{off['local_hits']:,}",
         f"{on['local_hits']:,}", ""],
        ["  loaded from the connector (external hits)", f"{off['external_hits']:,}",
         f"{on['external_hits']:,}", ""],
        ["  computed", f"{off['computed']:,}", f"{on['computed']:,}", _ratio(r["computed"])],
        ["TTFT p50 ms", _ms(off["ttft"]["p50"]), _ms(on["ttft"]["p50"]), _ratio(r["ttft_p50"])],
        ["TTFT p99 ms", _ms(off["ttft"]["p99"]), _ms(on["ttft"]["p99"]), _ratio(r["ttft_p99"])],
        ["output tok/s, median (min-max)", _tok_s_range(off), _tok_s_range(on), _ratio(r["tok_s"])],
        ["preemptions", str(off["num_preemptions"]), str(on["num_preemptions"]), ""],
    ]  # fmt: skip
    title = "KV connector: the same conversations without and with it, interleaved"
    _table(console, title, ["figure", "without", "with", "with / without"], rows)
    paired = r["paired_tok_s"]
    console.print(
        f"output tok/s with / without, repeat by repeat: median {_ratio(paired['median'])} "
        f"({_ratio(paired['min'])}-{_ratio(paired['max'])})"
    )
    runs = 2 * result["repeats"]
    if result["outputs_identical"] and result["prompts_identical"]:
        console.print(f"greedy outputs and prompts identical in all {runs} runs")
    else:
        agree = result["agreement"]
        console.print(
            f"[bold red]greedy outputs differ[/] with and without the connector (a bug): "
            f"{agree['tokens_pct']:.1f}% of tokens, {agree['requests_pct']:.1f}% of requests "
            "agree in the first run"
        )
