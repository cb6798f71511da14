"""Where nanovllm's step time goes: cProfile over a run at full concurrency.

`--profile` runs the workload once more under cProfile (not timed, not counted) and reports
the functions with the most time of their own, grouped by where they live: the scheduler and
block manager (`nanovllm/core`), the runner's input preparation and the sampler
(`nanovllm/executor`), the model (`nanovllm/models`, attention), the engine loop
(`nanovllm/engine`), and torch's own operators (C functions such as `torch._C._nn.linear`).
cProfile adds a cost to every Python call, so the shares lean towards Python-heavy code; they
say where to look, the step breakdown says how much.
"""

from __future__ import annotations

import cProfile
import pstats

from nanovllm.bench.workload import Workload

GROUPS = (
    ("nanovllm/core/", "scheduler + block manager"),
    ("nanovllm/executor/model_runner", "input preparation"),
    ("nanovllm/executor/sampler", "sampler"),
    ("nanovllm/executor/attention", "attention (python)"),
    ("nanovllm/models/", "model (python)"),
    ("nanovllm/engine/", "engine loop, detokenizer, outputs"),
    ("nanovllm/bench/", "bench instrumentation"),
)


def _group(filename: str, funcname: str) -> str:
    path = filename.replace("\\", "/")
    for marker, name in GROUPS:
        if marker in path:
            return name
    if filename == "~" and ("torch" in funcname or "method" in funcname):
        return "torch operators (C)"
    if "/torch/" in path:
        return "torch (python)"
    return "other"


def profile_run(adapter, workload: Workload, top: int = 25) -> dict:
    """Profile `adapter.run(workload)`; return the top functions and per-group totals."""
    profiler = cProfile.Profile()
    profiler.enable()
    run = adapter.run(workload)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(v[2] for v in stats.stats.values()) or 1.0  # tottime over all functions
    groups: dict[str, float] = {}
    rows = []
    for (filename, line, funcname), (
        _cc,
        ncalls,
        tottime,
        cumtime,
        _callers,
    ) in stats.stats.items():
        group = _group(filename, funcname)
        groups[group] = groups.get(group, 0.0) + tottime
        short = filename.split("site-packages/")[-1].split("/main/")[-1]
        rows.append(
            {
                "function": f"{short}:{line}({funcname})" if filename != "~" else funcname,
                "group": group,
                "ncalls": ncalls,
                "tottime_s": tottime,
                "cumtime_s": cumtime,
                "share": tottime / total,
            }
        )
    rows.sort(key=lambda r: r["tottime_s"], reverse=True)
    steps = run.extra.get("steps", [])
    return {
        "wall_s": run.wall_s,
        "num_steps": len(steps),
        "profiled_s": total,
        "groups": dict(sorted(((k, v / total) for k, v in groups.items()), key=lambda kv: -kv[1])),
        "top": rows[:top],
    }
