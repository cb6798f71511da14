"""One benchmark run: every engine on the same workload, side by side, then nanovllm's figures.

Per model, in order (README.md says why each step is there):

1. the workload, and the roofline: this machine's rates, measured now, and the workload's floor;
2. load every engine, nanovllm first, whose KV cache size the peers then copy; an engine that
   cannot run here is reported as skipped, with why;
3. warm every engine up, and pick transformers' fastest static batch size;
4. timed repeats, interleaved (A B C A B C), each run starting on an idle machine (quiet.py);
5. per engine: tok/s, nanovllm / engine, share of the ceiling, latency, greedy agreement;
6. nanovllm's own figures: step overhead and KV memory (from the timed runs), speculative
   decoding against none (`--speculative-config`: speculation.py), prefix caching on against
   off, `--profile`, `--serve URL`. (`--kv-transfer-config` adds nanovllm without its KV
   connector as an engine of its own, `nanovllm-no-kv-transfer`.)

Everything lands in one JSON-ready dict; report.py prints it and plot.py draws it.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field

from nanovllm.bench import analysis, quiet, roofline, speculation, stats
from nanovllm.bench.engines import Engine, EngineLimits, EngineUnavailable, make_engine
from nanovllm.bench.models import ModelInfo, resolve
from nanovllm.bench.records import EngineRun
from nanovllm.bench.workload import (
    Workload,
    random_workload,
    shared_prefix_workload,
    with_poisson_arrivals,
)

REFERENCE = "nanovllm"  # every ratio and agreement is taken against it; it always runs
COMPILED = "nanovllm-compiled"  # nanovllm with enforce_eager=False, when asked for


@dataclass
class BenchConfig:
    models: list[str] = field(default_factory=lambda: ["embedded"])
    engines: list[str] = field(
        default_factory=lambda: [
            "nanovllm",
            "hf-static",
            "hf-cb",
            "one-at-a-time",
            "vllm",
            "vllm-default",
        ]  # fmt: skip
    )
    num_requests: int = 64
    prompt_len: tuple[int, int] = (32, 256)
    output_len: tuple[int, int] = (64, 256)
    temperature: float = 0.0
    seed: int = 0
    request_rate: float | None = None  # requests/s: Poisson arrivals; None: all at once
    repeats: int = 3
    warmup_requests: int = 4
    threads: int | None = None
    hf_batch_sizes: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    vllm_python: str | None = None
    prefix_len: int = 256  # the prefix-caching workload's shared prefix
    extras: bool = True  # the prefix-caching runs
    profile: bool = False
    serve_url: str | None = None
    api_key: str | None = None  # for serve_url; None: $NANOVLLM_API_KEY
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    speculative_config: dict | None = None  # nanovllm speculates; compared with nanovllm-no-spec
    tensor_parallel_size: int = 1  # nanovllm's ranks; above 1, compared with nanovllm-tp1
    kv_transfer_config: dict | None = None  # nanovllm's KV connector; compared without it


class Progress:
    """What the suite tells the user while it runs; the CLI shows it with rich."""

    def start(self, description: str, total: int) -> None:  # a bar of `total` tokens
        pass

    def advance(self, n: int) -> None:
        pass

    def done(self) -> None:
        pass

    def log(self, message: str) -> None:
        pass


def run(cfg: BenchConfig, progress: Progress | None = None) -> dict:
    import torch
    import transformers

    progress = progress or Progress()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    environment = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],  # > cpu_count: other processes share the CPUs
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    models = [run_model(spec, cfg, environment["threads"], progress) for spec in cfg.models]
    return {"environment": environment, "config": asdict(cfg), "models": models}


def run_model(spec: str, cfg: BenchConfig, threads: int, progress: Progress) -> dict:
    progress.log(f"model {spec}")
    info = resolve(spec)
    max_model_len = min(cfg.max_model_len or info.max_position, info.max_position)
    main = random_workload(
        cfg.num_requests, cfg.prompt_len, cfg.output_len, info.vocab_size, cfg.seed, cfg.temperature
    )
    if main.max_seq_len > max_model_len:
        raise ValueError(
            f"the workload needs sequences of {main.max_seq_len} tokens, more than "
            f"max_model_len={max_model_len} of model {spec!r}"
        )
    timed = with_poisson_arrivals(main, cfg.request_rate, cfg.seed) if cfg.request_rate else main
    concurrency = min(cfg.max_num_seqs, main.num_requests)

    progress.log("measuring this machine's matmul rate and copy bandwidth (the roofline)")
    shape = roofline.ModelShape.from_config(info.config)
    prefill_rows = min(cfg.max_num_batched_tokens, 256)
    bound = roofline.for_workload(shape, main.lengths(), concurrency, prefill_rows)
    out: dict = {
        "model": {"name": spec, "path": info.path, **asdict(shape)},
        "workload": {
            "description": timed.description,
            "greedy": main.greedy,
            "prompt_tokens": main.num_prompt_tokens,
            "output_tokens": main.num_output_tokens,
            "lengths": main.lengths(),
        },
        "max_model_len": max_model_len,
        "threads": threads,
        "roofline": bound,
    }

    limits = EngineLimits(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        block_size=cfg.block_size,
        max_model_len=max_model_len,
        num_kv_blocks=cfg.num_kv_blocks,
        threads=cfg.threads,
        seed=cfg.seed,
        hf_batch_size=max(cfg.hf_batch_sizes),
        vllm_python=cfg.vllm_python,
    )
    first = [REFERENCE]
    if cfg.speculative_config is not None:
        from nanovllm.speculative_config import SpeculativeConfig

        spec = SpeculativeConfig.from_dict(cfg.speculative_config)  # a bad value is named here
        limits.speculative_config = cfg.speculative_config
        if spec.model is not None:  # a draft: `--model`'s names work here too (e.g. "100m:2")
            limits.speculative_config = {
                **cfg.speculative_config,
                "model": resolve(spec.model).path,
            }
        first.append(speculation.WITHOUT)
    if cfg.kv_transfer_config is not None:
        limits.kv_transfer_config = cfg.kv_transfer_config
        first.append("nanovllm-no-kv-transfer")
    if cfg.tensor_parallel_size > 1:
        limits.tensor_parallel_size = cfg.tensor_parallel_size
        first.append("nanovllm-tp1")
    names = first + [n for n in dict.fromkeys(cfg.engines) if n not in first]
    out["engines"] = report = {}  # name -> {"load": {...}} or {"skipped": why}, then figures
    engines = load_engines(names, info.path, limits, shape, report, progress)
    try:
        runs, calibration = measure(engines, main, timed, cfg, report, progress)
        for name, figures in summarize(runs, main.greedy, bound["ceiling_tok_s"]).items():
            report[name].update(figures)
        if calibration:
            report["hf-static"].update(batch_size=limits.hf_batch_size, calibration=calibration)
        for name, engine_runs in runs.items():  # (those that count them: nanovllm, vLLM)
            if "num_preemptions" in engine_runs[0].extra:
                report[name]["num_preemptions"] = engine_runs[0].extra["num_preemptions"]
        if REFERENCE in runs:
            ours = runs[REFERENCE]
            capacity = limits.num_kv_blocks * limits.block_size
            steps = ours[0].extra["steps"]
            out["memory"] = analysis.memory(
                steps, main.lengths(), capacity, limits.block_size, max_model_len
            )
            all_steps = [s for run in ours for s in run.extra["steps"]]
            out["overhead"] = analysis.overhead(all_steps, concurrency)
            if COMPILED in runs:  # the same breakdown for the compiled engine, to set beside
                compiled_steps = [s for run in runs[COMPILED] for s in run.extra["steps"]]
                report[COMPILED]["overhead"] = analysis.overhead(compiled_steps, concurrency)
            if cfg.speculative_config is not None and speculation.WITHOUT in runs:
                out["speculation"] = speculation.compare(
                    ours, runs[speculation.WITHOUT], main.greedy, cfg.speculative_config
                )
            if cfg.extras:
                out["prefix"] = prefix_caching(engines[REFERENCE], info, limits, cfg, progress)
            if cfg.profile:
                from nanovllm.bench.profile_step import profile_run

                progress.log("profiling nanovllm's step (cProfile, not timed)")
                out["profile"] = profile_run(engines[REFERENCE], main)
        if cfg.serve_url:
            out["serve"] = serve(cfg.serve_url, main, concurrency, progress, cfg.api_key)
    finally:
        for engine in engines.values():
            engine.close()
    return out


def load_engines(
    names: list[str],
    model_path: str,
    limits: EngineLimits,
    shape: roofline.ModelShape,
    report: dict,
    progress: Progress,
) -> dict[str, Engine]:
    """Load each engine; one that cannot run here is reported as skipped, with why."""
    engines: dict[str, Engine] = {}
    for name in names:
        progress.log(f"loading {name}")
        engine = make_engine(name, model_path, limits)
        start = time.perf_counter()
        try:
            info = engine.load()
        except (EngineUnavailable, ImportError, OSError, RuntimeError, ValueError) as exc:
            if name == REFERENCE:
                raise
            progress.log(f"skipping {name}: {exc}")
            report[name] = {"skipped": str(exc)}
            engine.close()
            continue
        report[name] = {"load": {**info, "load_s": time.perf_counter() - start}}
        engines[name] = engine
        if name == REFERENCE:  # the peers get nanovllm's KV cache: same blocks, same bytes
            limits.num_kv_blocks = info["num_kv_blocks"]
            limits.kv_cache_bytes = (
                limits.num_kv_blocks * limits.block_size * shape.kv_bytes_per_token
            )
            if "configuration" in info:
                kv_mib = limits.kv_cache_bytes / 2**20
                report[name]["load"]["configuration"] += f" ({kv_mib:,.0f} MiB)"
    return engines


def _timed(engine: Engine, workload: Workload, progress: Progress, label: str) -> EngineRun:
    # No engine starts beside the previous one's leftover work (quiet.py says what was seen).
    quiet.wait_until_idle()
    progress.start(label, workload.num_output_tokens)
    try:
        return engine.run(workload, progress.advance)
    finally:
        progress.done()


def measure(
    engines: dict[str, Engine],
    main: Workload,
    timed: Workload,
    cfg: BenchConfig,
    report: dict,
    progress: Progress,
) -> tuple[dict[str, list[EngineRun]], dict[int, float]]:
    """Warm-ups, the static batch size, then interleaved timed repeats. An engine that fails
    part-way is reported as skipped, keeps the repeats it finished and leaves `engines`."""
    runs: dict[str, list[EngineRun]] = {name: [] for name in engines}

    def attempt(name: str, workload: Workload, label: str) -> EngineRun | None:
        try:
            return _timed(engines[name], workload, progress, label)
        except EngineUnavailable as exc:
            progress.log(f"{name} failed: {exc}")
            report[name]["skipped"] = str(exc)
            engines.pop(name).close()
            return None

    n = main.num_requests
    for name in list(engines):  # hf-static warms up at its largest batch
        warm = max(cfg.hf_batch_sizes) if name == "hf-static" else cfg.warmup_requests
        attempt(name, main.head(min(warm, n), 0.1), f"warm-up {name}")

    calibration: dict[int, float] = {}
    if "hf-static" in engines:
        limits, shortened = engines["hf-static"].limits, main.head(n, 0.25)
        for size in sorted({min(b, n) for b in cfg.hf_batch_sizes}):
            limits.hf_batch_size = size
            if (run := attempt("hf-static", shortened, f"hf-static batch size {size}")) is None:
                break
            calibration[size] = run.output_tokens_per_s
        if calibration:
            limits.hf_batch_size = max(calibration, key=calibration.get)

    for rep in range(cfg.repeats):
        for name in list(engines):
            label = f"{name} ({rep + 1}/{cfg.repeats})"
            if (run := attempt(name, timed, label)) is not None:
                runs[name].append(run)
                progress.log(f"{label}: {run.output_tokens_per_s:,.0f} output tok/s")
    return {name: r for name, r in runs.items() if r}, calibration


def summarize(runs: dict[str, list[EngineRun]], greedy: bool, ceiling_tok_s: float) -> dict:
    """Per engine: tok/s over repeats, nanovllm / engine, share of the ceiling, latency, agreement."""
    ours = runs.get(REFERENCE)
    our_tok_s = stats.summary([r.output_tokens_per_s for r in ours])["median"] if ours else None
    figures = {}
    for name, engine_runs in runs.items():
        tok_s = stats.summary([r.output_tokens_per_s for r in engine_runs])
        figures[name] = {
            "runs": [
                {"wall_s": r.wall_s, "output_tokens": r.num_output_tokens} for r in engine_runs
            ],
            "tok_s": tok_s,
            "nanovllm_over_this": our_tok_s / tok_s["median"] if our_tok_s else None,
            # The same ratio repeat by repeat: repeat i of every engine ran within seconds of
            # the others', so a slow spell of the machine slows both sides of a pair.
            "paired_ratios": stats.summary(
                [o.output_tokens_per_s / r.output_tokens_per_s for o, r in zip(ours, engine_runs)]
            )
            if ours
            else None,
            "roofline_share": tok_s["median"] / ceiling_tok_s,
            "latency": stats.latency(engine_runs),
            "cdf": stats.cdf(engine_runs),
            "agreement": stats.agreement(ours[0], engine_runs[0]) if greedy and ours else None,
        }
    return figures


def prefix_caching(
    engine: Engine, info: ModelInfo, limits: EngineLimits, cfg: BenchConfig, progress: Progress
) -> dict:
    """nanovllm with and without prefix caching on a shared-prefix workload, interleaved."""
    suffix = (max(1, cfg.prompt_len[0] // 4), max(1, cfg.prompt_len[1] // 4))
    prefix_len = min(cfg.prefix_len, limits.max_model_len - suffix[1] - cfg.output_len[1])
    workload = shared_prefix_workload(
        cfg.num_requests,
        prefix_len,
        suffix,
        cfg.output_len,
        info.vocab_size,
        cfg.seed,
        cfg.temperature,
    )
    off = make_engine("nanovllm-no-prefix", info.path, limits)
    off.load()
    try:
        _timed(
            off, workload.head(min(cfg.warmup_requests, cfg.num_requests), 0.1), progress, "warm-up"
        )
        on_runs, off_runs = [], []
        for rep in range(cfg.repeats):
            on_runs.append(_timed(engine, workload, progress, f"prefix caching on ({rep + 1})"))
            off_runs.append(_timed(off, workload, progress, f"prefix caching off ({rep + 1})"))
    finally:
        off.close()

    def computed(run: EngineRun) -> int:  # prompt tokens the model actually ran
        return sum(s["num_prefill_tokens"] for s in run.extra["steps"])

    on = stats.summary([r.output_tokens_per_s for r in on_runs])
    without = stats.summary([r.output_tokens_per_s for r in off_runs])
    return {
        "workload": workload.description,
        "prompt_tokens": workload.num_prompt_tokens,
        "computed_with_cache": computed(on_runs[0]),
        "computed_without_cache": computed(off_runs[0]),
        "tok_s_with_cache": on,
        "tok_s_without_cache": without,
        "speedup": on["median"] / without["median"],
        "agreement": stats.agreement(off_runs[0], on_runs[0]) if workload.greedy else None,
    }


def serve(
    url: str, main: Workload, concurrency: int, progress: Progress, api_key: str | None = None
) -> dict:
    """The same prompts against a running server, `concurrency` clients at a time."""
    import os

    from nanovllm.serve.load import run_load_sync

    max_tokens = round(main.num_output_tokens / main.num_requests)
    progress.log(f"--serve {url}: {main.num_requests} requests, {concurrency} clients")
    report = run_load_sync(
        url,
        [r.prompt_token_ids for r in main.requests],
        concurrency=concurrency,
        max_tokens=max_tokens,
        temperature=main.temperature,
        api_key=api_key or os.environ.get("NANOVLLM_API_KEY"),
    )
    return {"max_tokens": max_tokens, **report.as_dict()}
