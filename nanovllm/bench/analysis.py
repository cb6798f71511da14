"""What nanovllm's own steps tell beyond throughput: where step time goes, and KV memory.

**Overhead.** A step is split into scheduling (the scheduler with its block allocation), input
preparation (building the flat tensors), the model (forward pass and logits), sampling, and the
rest (appending tokens, stop checks, detokenizing, building outputs, freeing blocks). Overhead is
the share of step time outside the model, over all steps and over the decode steps at full
concurrency (every running request decoding, none prefilling).

**KV memory, paged against contiguous.** A request holding `t` tokens of KV occupies
`ceil(t / block_size)` blocks in nanovllm's paged cache: at most `block_size - 1` empty slots,
in its last block (internal fragmentation). A contiguous cache must reserve `max_model_len`
slots per request up front, since it cannot grow a request's region later. A request with `p`
prompt and `o` output tokens holds `p + o - 1` tokens of KV at its longest (its last token is
returned, never fed back). The same `capacity` slots therefore hold `capacity // max_model_len`
requests contiguously and `capacity // mean(paged slots per request)` paged.
"""

from __future__ import annotations

from collections.abc import Sequence

PARTS = ("schedule", "prepare", "model", "sample")


def step_breakdown(steps: Sequence[dict]) -> dict:
    """Seconds and shares of each part of the step, summed over `steps`."""
    wall = sum(s["wall"] for s in steps)
    seconds = {part: sum(s[part] for s in steps) for part in PARTS}
    seconds["other"] = max(0.0, wall - sum(seconds.values()))
    return {
        "num_steps": len(steps),
        "share": {k: v / wall if wall else 0.0 for k, v in seconds.items()},
        "overhead_share": 1.0 - seconds["model"] / wall if wall else 0.0,
        "mean_step_ms": 1000.0 * wall / len(steps) if steps else 0.0,
    }


def overhead(steps: Sequence[dict], full_concurrency: int) -> dict:
    """Breakdown over all steps, and over decode steps with `full_concurrency` sequences."""
    full = [s for s in steps if s["num_seqs"] >= full_concurrency and not s["num_prefill_tokens"]]
    return {
        "all_steps": step_breakdown(steps),
        "full_concurrency": full_concurrency,
        "at_full_concurrency": step_breakdown(full) if full else None,
    }


def paged_slots(num_tokens: int, block_size: int) -> int:
    """Slots allocated to hold `num_tokens` tokens' KV in blocks of `block_size`."""
    return -(-num_tokens // block_size) * block_size


def memory(
    steps: Sequence[dict],
    lengths: Sequence[tuple[int, int]],
    capacity_slots: int,
    block_size: int,
    max_model_len: int,
) -> dict:
    """Fragmentation over the run and at its peak; requests that fit, paged and contiguous."""
    allocated = sum(s["allocated_slots"] for s in steps)
    peak = max(steps, key=lambda s: s["allocated_slots"])
    contiguous_at_peak = peak["num_running"] * max_model_len
    stride = max(1, len(steps) // 400)
    mean_paged = sum(paged_slots(p + o - 1, block_size) for p, o in lengths) / len(lengths)
    return {
        "capacity_slots": capacity_slots,
        # empty slot-steps over allocated slot-steps
        "fragmentation": 1.0 - sum(s["filled_slots"] for s in steps) / allocated
        if allocated
        else 0.0,
        "peak_running": peak["num_running"],
        "peak_allocated_slots": peak["allocated_slots"],
        "peak_filled_slots": peak["filled_slots"],
        "peak_contiguous_slots": contiguous_at_peak,  # max_model_len per running request
        "fit_contiguous": capacity_slots // max_model_len,
        "fit_paged": int(capacity_slots // mean_paged),
        "series": {  # every `stride`-th step (at most ~400 points), for the plot
            "step": list(range(0, len(steps), stride)),
            "allocated": [s["allocated_slots"] for s in steps[::stride]],
            "filled": [s["filled_slots"] for s in steps[::stride]],
            "running": [s["num_running"] for s in steps[::stride]],
        },
    }
