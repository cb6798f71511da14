"""`--profile`: where nanovllm's step time goes, by cProfile over one more run.

The run is not timed and not counted. Functions are grouped by where they live: the scheduler
and block manager (`nanovllm/core`), the runner's input preparation and the sampler
(`nanovllm/executor`), the model (`nanovllm/models`), the engine loop (`nanovllm/engine`), and
torch's own operators (C functions such as `torch._C._nn.linear`). cProfile adds a cost to every
Python call, so the shares lean towards Python-heavy code: they say where to look; the step
breakdown (analysis.py) says how much.
"""

from __future__ import annotations

import cProfile
import os
import pstats

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
    return "torch (python)" if "/torch/" in path else "other"


def profile_run(engine, workload, top: int = 15) -> dict:
    """cProfile `engine.run(workload)`: own-time shares per group, and the top functions."""
    profiler = cProfile.Profile()
    profiler.runcall(engine.run, workload)
    entries = pstats.Stats(profiler).stats.items()  # (file, line, func) -> (cc, n, own, cum, _)
    total = sum(own for (_, _, own, _, _) in (v for _, v in entries)) or 1.0
    groups: dict[str, float] = {}
    rows = []
    for (filename, line, func), (_, ncalls, own, cum, _) in entries:
        group = _group(filename, func)
        groups[group] = groups.get(group, 0.0) + own / total
        short = filename.split("site-packages/")[-1].removeprefix(os.getcwd() + os.sep)
        where = func if filename == "~" else f"{short}:{line}({func})"
        rows.append(
            {"function": where, "ncalls": ncalls, "own_s": own, "cum_s": cum, "share": own / total}
        )
    rows.sort(key=lambda r: -r["own_s"])
    return {"groups": dict(sorted(groups.items(), key=lambda kv: -kv[1])), "top": rows[:top]}
