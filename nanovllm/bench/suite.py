"""The benchmark run: every engine on the same workload, fairly, then nanovllm's extra figures.

For each model:

1. build the workloads (token ids drawn for this model's vocabulary, lengths the same for all);
2. load every engine (weights and caches allocated, nothing timed); an engine that cannot run
   here is skipped with its reason;
3. warm every engine up on a few short requests (not timed);
4. pick transformers' best static batch size on a shortened copy of the workload;
5. timed repeats, interleaved (A B C A B C) so that a noisy neighbour slows every engine alike;
6. nanovllm's extra experiments: prefix caching on/off on the shared-prefix workload (also
   interleaved), the linear-layer floor for its step shapes, optionally a cProfile run, and
   optionally an online load against a running server (`--serve URL`);
7. figures: throughput (median, min-max), ratio to nanovllm, TTFT/ITL percentiles, greedy
   agreement, KV memory, step overhead, targets.

Everything lands in one JSON-ready dict; `report.py` prints it and `plot.py` draws it.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field

from nanovllm.bench import analysis, stats
from nanovllm.bench.engine_base import EngineUnavailable
from nanovllm.bench.models import ModelInfo, fingerprint, resolve
from nanovllm.bench.records import EngineRun
from nanovllm.bench.workload import (
    Workload,
    random_workload,
    shared_prefix_workload,
    with_poisson_arrivals,
)

ALL_ENGINES = ("nanovllm", "hf-static", "hf-cb", "one-at-a-time", "vllm", "vllm-compiled")
DEFAULT_ENGINES = ("nanovllm", "hf-static", "hf-cb", "one-at-a-time", "vllm")


@dataclass
class BenchConfig:
    models: list[str] = field(default_factory=lambda: ["embedded"])
    engines: list[str] = field(default_factory=lambda: list(DEFAULT_ENGINES))
    num_requests: int = 64
    prompt_len: tuple[int, int] = (32, 256)
    output_len: tuple[int, int] = (64, 256)
    temperature: float = 0.0
    seed: int = 0
    repeats: int = 3
    threads: int | None = None
    request_rate: float | None = None  # requests/s: online arrivals; None: all at once
    prefix_len: int = 256  # shared-prefix workload
    prefix_requests: int | None = None  # default: num_requests
    hf_batch_sizes: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    calibration_output_scale: float = 0.25
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    vllm_python: str | None = None
    extras: bool = True  # prefix caching and floor experiments
    profile: bool = False
    serve_url: str | None = None
    warmup_requests: int = 4


class Progress:
    """What the suite tells the user while it runs (the CLI backs it with rich)."""

    def start(self, description: str, total: int) -> None:  # a new bar
        pass

    def advance(self, n: int) -> None:
        pass

    def done(self) -> None:
        pass

    def log(self, message: str) -> None:
        pass


def _make_engine(
    name: str, info: ModelInfo, cfg: BenchConfig, max_model_len: int, threads, kv: dict
):
    """An engine adapter; `kv` is nanovllm's KV size (blocks, bytes), mirrored by the peers."""
    from nanovllm.bench.engine_hf_cb import HFContinuousBatchingEngine
    from nanovllm.bench.engine_hf_static import HFStaticEngine
    from nanovllm.bench.engine_nanovllm import NanovllmEngine
    from nanovllm.bench.engine_vllm import VLLMEngine

    path = str(info.path)
    if name in ("nanovllm", "nanovllm-no-prefix"):
        return NanovllmEngine(
            path,
            name=name,
            block_size=cfg.block_size,
            num_kv_blocks=cfg.num_kv_blocks,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_prefix_caching=name == "nanovllm",
            dtype="float32",
            seed=cfg.seed,
            num_threads=threads,
        )
    if name == "hf-static":
        return HFStaticEngine(path, batch_size=max(cfg.hf_batch_sizes))
    if name == "one-at-a-time":
        return HFStaticEngine(path, batch_size=1, name="one-at-a-time")
    if name == "hf-cb":
        return HFContinuousBatchingEngine(
            path,
            page_size=cfg.block_size,
            num_blocks=kv.get("num_kv_blocks") or _kv_blocks(cfg, max_model_len),
            max_batch_tokens=cfg.max_num_batched_tokens,
            max_requests_per_batch=cfg.max_num_seqs,
        )
    if name in ("vllm", "vllm-compiled"):
        return VLLMEngine(
            path,
            python=cfg.vllm_python,
            compiled=name == "vllm-compiled",
            threads=threads,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=max_model_len,
            block_size=cfg.block_size,
            kv_cache_bytes=kv.get("kv_cache_bytes") or 2**30,
            seed=cfg.seed,
        )
    raise ValueError(f"unknown engine {name!r}; choose from {', '.join(ALL_ENGINES)}")


def _kv_blocks(cfg: BenchConfig, max_model_len: int) -> int:
    # Only when nanovllm's own figure is missing: every sequence at full length.
    if cfg.num_kv_blocks is not None:
        return cfg.num_kv_blocks
    return cfg.max_num_seqs * -(-max_model_len // cfg.block_size)


def environment(threads: int) -> dict:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": threads,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def run(cfg: BenchConfig, progress: Progress | None = None) -> dict:
    import torch

    progress = progress or Progress()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    threads = torch.get_num_threads()
    result = {"environment": environment(threads), "config": _config_dict(cfg), "models": []}
    for spec in cfg.models:
        progress.log(f"model {spec}")
        result["models"].append(run_model(spec, cfg, threads, progress))
    return result


def _config_dict(cfg: BenchConfig) -> dict:
    from dataclasses import asdict

    return asdict(cfg)


def _timed(engine, workload: Workload, progress: Progress, label: str, on_tokens=True) -> EngineRun:
    progress.start(label, workload.num_output_tokens)
    try:
        return engine.run(workload, progress.advance if on_tokens else None)
    finally:
        progress.done()


def run_model(spec: str, cfg: BenchConfig, threads: int, progress: Progress) -> dict:
    info = resolve(spec)
    if info.note:
        progress.log(info.note)
    max_model_len = min(cfg.max_model_len or info.max_position, info.max_position)
    main = random_workload(
        cfg.num_requests,
        cfg.prompt_len,
        cfg.output_len,
        info.vocab_size,
        seed=cfg.seed,
        temperature=cfg.temperature,
    )
    if main.max_seq_len > max_model_len:
        raise ValueError(
            f"the workload needs sequences of {main.max_seq_len} tokens, more than "
            f"max_model_len={max_model_len} of model {spec!r}"
        )
    timed_workload = (
        with_poisson_arrivals(main, cfg.request_rate, cfg.seed) if cfg.request_rate else main
    )
    out: dict = {
        "model": info.to_dict(),
        "model_kind": "100m" if spec == "100m" else "small",  # which targets apply
        "workload": {
            "name": timed_workload.name,
            "description": timed_workload.description,
            "num_requests": main.num_requests,
            "prompt_tokens": main.num_prompt_tokens,
            "output_tokens": main.num_output_tokens,
            "greedy": main.greedy,
            "lengths": main.lengths(),
        },
        "max_model_len": max_model_len,
        "threads": threads,
        "engines": {},
        "notes": [],
    }
    if info.note:
        out["notes"].append(info.note)

    # 2. load
    weights_before = fingerprint(info.path)
    engines = {}
    names = list(dict.fromkeys(cfg.engines))
    if "nanovllm" not in names:
        names.insert(0, "nanovllm")  # the reference for ratios, agreement and the extras
    for name in names:
        progress.log(f"loading {name}")
        kv = out["engines"].get("nanovllm", {}).get("load", {})
        engine = _make_engine(name, info, cfg, max_model_len, threads, kv)
        start = time.perf_counter()
        try:
            load_info = engine.load()
        except (EngineUnavailable, ImportError, OSError, RuntimeError, ValueError) as exc:
            if name == "nanovllm":
                raise
            progress.log(f"skipping {name}: {exc}")
            out["engines"][name] = {"skipped": str(exc)}
            engine.close()
            continue
        load_info["load_s"] = time.perf_counter() - start
        engines[name] = engine
        out["engines"][name] = {"load": load_info, "runs": []}

    if fingerprint(info.path) != weights_before:
        out["notes"].append(
            f"the checkpoint in {info.path} changed while engines loaded: they may not have "
            "run the same weights (compare with care)"
        )
    try:
        _measure(engines, main, timed_workload, cfg, out, progress)
        if "nanovllm" in engines:
            _extras(engines["nanovllm"], info, cfg, max_model_len, threads, main, out, progress)
        if cfg.serve_url:
            out["serve"] = _serve(cfg, main, progress)
    finally:
        for engine in engines.values():
            engine.close()
    _summarize(out, cfg)
    return out


def _measure(engines, main, timed_workload, cfg, out, progress) -> None:
    # 3. warm-up (not timed): first calls allocate, pick kernels, fill caches.
    warm = main.head(min(cfg.warmup_requests, main.num_requests), 0.1)
    for name, engine in list(engines.items()):
        workload = warm
        if name == "hf-static":  # its largest candidate batch
            workload = main.head(min(engine.batch_size, main.num_requests), 0.05)
        try:
            _timed(engine, workload, progress, f"warm-up {name}")
        except EngineUnavailable as exc:
            _drop(engines, name, out, exc, progress)

    # 4. transformers' best static batch size, on the workload with shorter outputs.
    if "hf-static" in engines:
        from nanovllm.bench.engine_hf_static import pick_batch_size

        sizes = sorted({min(b, main.num_requests) for b in cfg.hf_batch_sizes})
        calib = main.head(main.num_requests, cfg.calibration_output_scale)
        progress.log(f"hf-static: trying batch sizes {sizes}")
        progress.start("hf-static batch sizes", calib.num_output_tokens * len(sizes))
        try:
            best, rates = pick_batch_size(engines["hf-static"], calib, sizes, progress.advance)
        finally:
            progress.done()
        out["engines"]["hf-static"]["load"]["batch_size"] = best
        out["hf_static_calibration"] = {str(k): v for k, v in rates.items()}

    # 5. interleaved repeats
    runs: dict[str, list[EngineRun]] = {name: [] for name in engines}
    for rep in range(cfg.repeats):
        for name, engine in list(engines.items()):
            label = f"{name} ({rep + 1}/{cfg.repeats})"
            try:
                run = _timed(engine, timed_workload, progress, label)
            except EngineUnavailable as exc:
                _drop(engines, name, out, exc, progress)
                continue
            runs[name].append(run)
            progress.log(f"{label}: {run.output_tokens_per_s:,.0f} output tok/s")
    out["_runs"] = runs  # consumed by _summarize, not serialized


def _drop(engines: dict, name: str, out: dict, exc: Exception, progress) -> None:
    """An engine that failed mid-way: reported as skipped, its runs so far kept."""
    progress.log(f"{name} failed: {exc}")
    out["engines"][name]["skipped"] = str(exc)
    engines.pop(name).close()


def _extras(adapter, info, cfg, max_model_len, threads, main, out, progress) -> None:
    from nanovllm.bench.floor import linear_floor

    runs: list[EngineRun] = out["_runs"]["nanovllm"]
    steps = runs[0].extra["steps"]
    load = out["engines"]["nanovllm"]["load"]
    # Memory and overhead come from the timed runs themselves: free, always reported.
    out["memory"] = analysis.memory(
        steps, main.lengths(), load["num_kv_blocks"], load["block_size"], max_model_len
    )
    out["kv_series"] = analysis.kv_series(steps, max_model_len)
    full = min(cfg.max_num_seqs, main.num_requests)
    out["overhead"] = analysis.overhead([s for r in runs for s in r.extra["steps"]], full)
    if cfg.extras:
        # The floor: nanovllm's own linear layers for its own step shapes.
        progress.log("timing the linear layers alone (the floor)")
        shapes = [(s["num_tokens"], s["num_sampled"]) for s in steps]
        floor = linear_floor(adapter.engine.model, shapes)
        floor["output_tokens_per_s"] = runs[0].num_output_tokens / floor["seconds"]
        out["floor"] = floor

        # Prefix caching on/off, interleaved.
        out["prefix"] = _prefix_experiment(adapter, info, cfg, max_model_len, threads, progress)
    if cfg.profile:
        from nanovllm.bench.profile_step import profile_run

        progress.log("profiling nanovllm's step (cProfile, not timed)")
        out["profile"] = profile_run(adapter, main)


def _prefix_experiment(adapter, info, cfg, max_model_len, threads, progress) -> dict:
    n = cfg.prefix_requests or cfg.num_requests
    suffix = (max(1, cfg.prompt_len[0] // 4), max(1, cfg.prompt_len[1] // 4))
    prefix_len = min(cfg.prefix_len, max_model_len - suffix[1] - cfg.output_len[1])
    workload = shared_prefix_workload(
        n, prefix_len, suffix, cfg.output_len, info.vocab_size, cfg.seed, cfg.temperature
    )
    off = _make_engine("nanovllm-no-prefix", info, cfg, max_model_len, threads, {})
    off.load()
    try:
        _timed(off, workload.head(min(cfg.warmup_requests, n), 0.1), progress, "warm-up no-prefix")
        on_runs, off_runs = [], []
        for rep in range(cfg.repeats):
            on_runs.append(_timed(adapter, workload, progress, f"prefix on ({rep + 1})"))
            off_runs.append(_timed(off, workload, progress, f"prefix off ({rep + 1})"))
    finally:
        off.close()

    def computed(run: EngineRun) -> int:
        return sum(s["num_prefill_tokens"] for s in run.extra["steps"])

    on_rate = stats.summary([r.output_tokens_per_s for r in on_runs])
    off_rate = stats.summary([r.output_tokens_per_s for r in off_runs])
    return {
        "workload": workload.description,
        "prompt_tokens": workload.num_prompt_tokens,
        "computed_with_cache": computed(on_runs[0]),
        "computed_without_cache": computed(off_runs[0]),
        "cache_hit_tokens": on_runs[0].extra["prefix_cache_hits"],
        "tok_s_with_cache": on_rate,
        "tok_s_without_cache": off_rate,
        "throughput_ratio": on_rate["median"] / off_rate["median"] if off_rate["median"] else None,
        "agreement": stats.agreement(on_runs[0], off_runs[0]) if workload.greedy else None,
    }


def _serve(cfg: BenchConfig, main: Workload, progress) -> dict:
    try:
        from nanovllm.serve.load import run_load_sync
    except ImportError as exc:
        progress.log(f"--serve: the load generator is not available ({exc}); skipped")
        return {"skipped": f"nanovllm.serve.load not available: {exc}"}
    max_tokens = round(main.num_output_tokens / main.num_requests)
    concurrency = min(cfg.max_num_seqs, main.num_requests)
    progress.log(f"--serve {cfg.serve_url}: {main.num_requests} requests, {concurrency} clients")
    report = run_load_sync(
        cfg.serve_url,
        [r.prompt_token_ids for r in main.requests],
        concurrency=concurrency,
        max_tokens=max_tokens,
        temperature=main.temperature,
    )
    return {"max_tokens": max_tokens, **report.as_dict()}


def _summarize(out: dict, cfg: BenchConfig) -> None:
    runs: dict[str, list[EngineRun]] = out.pop("_runs", {})
    ref = runs.get("nanovllm", [None])[0] if runs.get("nanovllm") else None
    medians: dict[str, float] = {}
    for name, engine_runs in runs.items():
        entry = out["engines"][name]
        if not engine_runs:
            continue
        rates = [r.output_tokens_per_s for r in engine_runs]
        entry["runs"] = [
            {
                "wall_s": r.wall_s,
                "output_tokens": r.num_output_tokens,
                "tok_s": r.output_tokens_per_s,
            }
            for r in engine_runs
        ]
        entry["tok_s"] = stats.summary(rates)
        entry["latency"] = stats.latency(engine_runs)
        medians[name] = entry["tok_s"]["median"]
        if ref is not None and engine_runs[0].records and out["workload"]["greedy"]:
            entry["agreement"] = stats.agreement(ref, engine_runs[0])
        entry["cdf"] = _cdf(engine_runs)
        if name == "nanovllm":
            r0 = engine_runs[0].extra
            entry["preemptions"] = r0["num_preemptions"]
            entry["prefix_cache_hits"] = r0["prefix_cache_hits"]
    ours = medians.get("nanovllm")
    for name, m in medians.items():
        out["engines"][name]["ratio_to_nanovllm"] = m / ours if ours else None
        out["engines"][name]["nanovllm_speedup"] = ours / m if ours and m else None
    if "floor" in out and ours:
        out["floor"]["nanovllm_share"] = ours / out["floor"]["output_tokens_per_s"]
    full = (out.get("overhead") or {}).get("at_full_concurrency") or {}
    overhead_share = full.get("overhead_share")
    frag = (out.get("memory") or {}).get("fragmentation_time_weighted")
    out["targets"] = analysis.targets(out["model_kind"], medians, overhead_share, frag)


def _cdf(runs: list[EngineRun], points: int = 101) -> dict:
    ttft = [r.ttft for run in runs for r in run.records if r.ttft is not None]
    itl = [x for run in runs for r in run.records for x in r.itls]
    qs = [100.0 * i / (points - 1) for i in range(points)]
    return {
        "q": qs,
        "ttft": [stats.percentile(ttft, q) for q in qs] if ttft else [],
        "itl": [stats.percentile(itl, q) for q in qs] if itl else [],
    }
