"""From nanovllm's per-step records to the report's figures: overhead, memory, targets.

- Engine overhead: the share of step time outside the model's forward pass. A step is split
  into scheduling (the scheduler, with its block allocation), input preparation (building the
  flat tensors), the model (forward pass and logits), sampling, and the rest (appending tokens,
  stop checks, detokenizing, building outputs, freeing finished requests' blocks). Reported
  over the whole run and over the steps that ran at full concurrency (the batch the targets
  speak of: 64 requests at once).
- Memory: internal fragmentation (allocated slots holding nothing) over the run and at peak,
  against reserving `max_model_len` contiguously for every running request at the same moment,
  and how many of the workload's requests fit in nanovllm's KV memory either way.
- Targets: the issue's goals, each with the measured figure and whether it is met.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanovllm.bench.memory import requests_that_fit, snapshot, time_weighted_fragmentation

PARTS = ("schedule", "prepare", "model", "sample", "other")


def step_breakdown(steps: Sequence[dict]) -> dict:
    """Seconds and shares of each part of the step, summed over `steps`."""
    wall = sum(s["wall"] for s in steps)
    parts = {
        "schedule": sum(s["schedule"] for s in steps),
        "prepare": sum(s["prepare"] for s in steps),
        "model": sum(s["model"] for s in steps),
        "sample": sum(s["sample"] for s in steps),
    }
    parts["other"] = max(0.0, wall - sum(parts.values()))
    return {
        "num_steps": len(steps),
        "wall_s": wall,
        "seconds": parts,
        "share": {k: (v / wall if wall else 0.0) for k, v in parts.items()},
        "overhead_share": 1.0 - parts["model"] / wall if wall else 0.0,
        "mean_step_ms": 1000.0 * wall / len(steps) if steps else 0.0,
    }


def overhead(steps: Sequence[dict], full_concurrency: int) -> dict:
    """Breakdown over all steps, and over decode steps with `full_concurrency` sequences."""
    full = [s for s in steps if s["num_seqs"] >= full_concurrency and s["num_prefill_tokens"] == 0]
    return {
        "all_steps": step_breakdown(steps),
        "full_concurrency": full_concurrency,
        "at_full_concurrency": step_breakdown(full) if full else None,
    }


def memory(
    steps: Sequence[dict],
    lengths: Sequence[tuple[int, int]],
    num_kv_blocks: int,
    block_size: int,
    max_model_len: int,
) -> dict:
    """Fragmentation over the run and at peak, contiguous reservation, requests that fit."""
    allocated = [s["allocated_slots"] for s in steps]
    filled = [s["filled_slots"] for s in steps]
    peak = max(steps, key=lambda s: s["allocated_slots"]) if steps else None
    capacity = num_kv_blocks * block_size
    fit = requests_that_fit(lengths, capacity, block_size, max_model_len)
    out = {
        "capacity_slots": capacity,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "fragmentation_time_weighted": time_weighted_fragmentation(allocated, filled),
        "fit_contiguous": fit.contiguous,
        "fit_paged": fit.paged,
        "fit_ratio": fit.ratio,
        "paged_mean_slots_per_request": fit.paged_mean_slots,
        "peak_running": max((s["num_running"] for s in steps), default=0),
    }
    if peak is not None:
        contiguous = peak["num_running"] * max_model_len
        out["at_peak"] = {
            "num_running": peak["num_running"],
            "allocated_slots": peak["allocated_slots"],
            "filled_slots": peak["filled_slots"],
            "fragmentation": (
                1.0 - peak["filled_slots"] / peak["allocated_slots"]
                if peak["allocated_slots"]
                else 0.0
            ),
            "contiguous_slots": contiguous,
            "contiguous_waste": 1.0 - peak["filled_slots"] / contiguous if contiguous else 0.0,
            "paged_vs_contiguous": peak["allocated_slots"] / contiguous if contiguous else 0.0,
        }
    # What the workload itself implies at the end of every request, both ways (no timing).
    final = snapshot([p + o - 1 for p, o in lengths], block_size, max_model_len)
    out["all_requests_at_full_length"] = {
        "filled_slots": final.filled_slots,
        "paged_slots": final.paged_slots,
        "contiguous_slots": final.contiguous_slots,
        "fragmentation": final.fragmentation,
        "contiguous_waste": final.contiguous_waste,
    }
    return out


def kv_series(steps: Sequence[dict], max_model_len: int, max_points: int = 400) -> dict:
    """Allocated, filled and would-be-contiguous slots over time, thinned for plotting."""
    stride = max(1, len(steps) // max_points)
    picked = list(steps[::stride])
    return {
        "t": [s["t_end"] for s in picked],
        "allocated": [s["allocated_slots"] for s in picked],
        "filled": [s["filled_slots"] for s in picked],
        "contiguous": [s["num_running"] * max_model_len for s in picked],
        "running": [s["num_running"] for s in picked],
    }


def _check(name: str, value: float | None, goal: float, higher_is_better: bool, unit: str):
    if value is None:
        return {"target": name, "value": None, "goal": goal, "met": None, "unit": unit}
    met = value >= goal if higher_is_better else value <= goal
    return {"target": name, "value": value, "goal": goal, "met": met, "unit": unit}


def targets(model_kind: str, tok_s: dict[str, float], overhead_share, fragmentation) -> list:
    """The issue's targets for this model; `tok_s` maps engine -> median output tokens/s."""
    ours = tok_s.get("nanovllm")
    hf = {k: v for k, v in tok_s.items() if k in ("hf-static", "hf-cb", "one-at-a-time")}
    vllm = [v for k, v in tok_s.items() if k.startswith("vllm")]

    def ratio(other: float | None) -> float | None:
        return ours / other if ours and other else None

    checks = []
    if model_kind == "100m":
        fastest_hf = max(hf.values()) if hf else None
        checks.append(_check("x transformers' fastest path", ratio(fastest_hf), 3.0, True, "x"))
        checks.append(_check("x vLLM", ratio(max(vllm) if vllm else None), 1.5, True, "x"))
    else:
        checks.append(_check("x transformers static", ratio(tok_s.get("hf-static")), 5, True, "x"))
        checks.append(_check("x vLLM", ratio(max(vllm) if vllm else None), 2.0, True, "x"))
    checks.append(_check("engine overhead, full batch", overhead_share, 0.10, False, "share"))
    checks.append(_check("internal fragmentation", fragmentation, 0.04, False, "share"))
    return checks
