"""`nanovllm stress`: the engine under a long queue, and a soak run with faults.

Two measurements that back the robustness guarantees in the README:

- `--load`: time per step with 100 waiting requests vs 10,000. The scheduler only ever looks at
  the head of the waiting queue, so the ratio should be close to 1. Both the whole step and the
  scheduler alone are reported.
- `--soak N`: N requests with random prompt and output lengths, random sampling settings and
  random aborts, pushed through a small KV cache (so preemption happens). Afterwards every block
  must be free again, and the process's memory must return to where it started (compared
  after a warm-up soak, so allocator caches and lazy imports are already paid for).
- `--memory`: a steady stream of about 16 concurrent requests (random prompt and output lengths,
  so every step's shapes differ) for 3,000 steps; the process's RSS at step 500, 1,000, ...,
  3,000 and its growth from step 500. Memory that grows with the number of steps served is a
  leak however slow; `--tracemalloc` also prints where the Python heap grew in between.

All run on the embedded model by default (`--model` for another checkpoint).
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import time

from nanovllm.config import EngineConfig
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.sampling_params import SamplingParams


def rss_mb() -> float:
    """Current resident memory in MB (from /proc; falls back to the peak on other systems)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_steps_with_queue(
    engine: LLMEngine, num_waiting: int, num_steps: int
) -> tuple[float, float]:
    """Mean seconds per step and per schedule() with `num_waiting` requests queued."""
    vocab = engine.model_args.vocab_size
    for i in range(num_waiting):
        engine.add_request(
            f"load-{num_waiting}-{i}",
            [1 + i % (vocab - 1)] * 8,
            SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        )
    # Python's cyclic GC rescans every live object in its full collections, so 10,000 queued
    # requests make *collections* slower whatever the engine does. Freeze the queued objects into
    # the permanent generation (as vLLM does after start-up) to measure the scheduler itself.
    gc.collect()
    gc.freeze()
    for _ in range(3):  # warm-up
        engine.step()
    step_total = schedule_total = 0.0
    for _ in range(num_steps):
        start = time.perf_counter()
        engine.step()
        step_total += time.perf_counter() - start
        schedule_total += engine.stats.last.schedule_time
    for rid in engine.stats.live.request_ids:
        engine.abort_request(rid)
    engine.step()
    gc.unfreeze()
    return step_total / num_steps, schedule_total / num_steps


def run_load(model: str | None, steps: int) -> dict[str, float]:
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=8, max_num_batched_tokens=64))
    small_step, small_sched = time_steps_with_queue(engine, 100, steps)
    big_step, big_sched = time_steps_with_queue(engine, 10_000, steps)
    return {
        "step_ms_100": small_step * 1e3,
        "step_ms_10000": big_step * 1e3,
        "step_ratio": big_step / small_step,
        "schedule_us_100": small_sched * 1e6,
        "schedule_us_10000": big_sched * 1e6,
        "schedule_ratio": big_sched / small_sched,
    }


def soak(
    engine: LLMEngine, num_requests: int, seed: int, abort_rate: float = 0.1
) -> dict[str, int]:
    """Random requests, sampling settings and aborts; returns counts by finish reason."""
    rng = random.Random(seed)
    vocab = engine.model_args.vocab_size
    capacity = engine.num_kv_blocks * engine.config.block_size
    counts: dict[str, int] = {}
    next_id = 0
    while next_id < num_requests or engine.has_unfinished_requests():
        # Keep arrivals going while the engine works: continuous batching under churn.
        for _ in range(rng.randint(0, 4)):
            if next_id >= num_requests:
                break
            prompt_len = rng.randint(1, min(64, capacity // 4))
            params = SamplingParams(
                temperature=rng.choice([0.0, 0.7, 1.0]),
                top_p=rng.choice([1.0, 0.9]),
                top_k=rng.choice([-1, 20]),
                max_tokens=rng.randint(1, min(48, capacity // 4)),
                seed=rng.choice([None, rng.randrange(1000)]),
                ignore_eos=rng.random() < 0.5,
            )
            engine.add_request(
                f"soak-{seed}-{next_id}", [rng.randrange(vocab) for _ in range(prompt_len)], params
            )
            next_id += 1
        live = engine.stats.live.request_ids
        if live and rng.random() < abort_rate:
            engine.abort_request(rng.choice(live))
        for out in engine.step():
            if out.finished:
                reason = out.outputs[0].finish_reason or "?"
                counts[reason] = counts.get(reason, 0) + 1
    engine.step()  # collect the last abort outputs
    return counts


def run_soak(model: str | None, num_requests: int) -> dict[str, float]:
    engine = LLMEngine(
        EngineConfig(
            model=model, block_size=8, num_kv_blocks=64, max_num_seqs=16, max_num_batched_tokens=128
        )
    )
    soak(engine, max(num_requests // 10, 20), seed=0)  # warm-up: lazy allocations happen here
    gc.collect()
    rss_before = rss_mb()
    free_before = engine.stats.live.num_free_blocks
    start = time.perf_counter()
    counts = soak(engine, num_requests, seed=1)
    elapsed = time.perf_counter() - start
    gc.collect()
    return {
        "requests": num_requests,
        "seconds": elapsed,
        "preemptions": engine.stats.num_preemptions,
        "free_blocks_before": free_before,
        "free_blocks_after": engine.stats.live.num_free_blocks,
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_mb(),
        **{f"finished_{k}": v for k, v in counts.items()},
    }


def memory_run(
    engine: LLMEngine,
    num_steps: int,
    concurrency: int = 16,
    every: int = 500,
    seed: int = 0,
    trace: bool = False,
) -> list[tuple[int, float, float]]:
    """Keep `concurrency` requests in flight for `num_steps` steps; every `every` steps, the
    RSS (MB) and the mean step time (ms) since the previous sample.

    Prompts and outputs have random lengths and half the requests are text prompts (tokenized
    and detokenized), so the batch's shapes change from step to step as a server's do."""
    rng = random.Random(seed)
    vocab = engine.model_args.vocab_size
    words = ["the", "king", "and", "queen", "of", "love", "night", "my", "lord", "sweet"]
    samples: list[tuple[int, float, float]] = []  # (step, RSS MB, mean ms per step)
    snapshot = None
    step_time = 0.0
    next_id = 0
    for step in range(1, num_steps + 1):
        while engine.get_num_unfinished_requests() < concurrency:
            params = SamplingParams(
                temperature=rng.choice([0.0, 0.8]),
                top_p=rng.choice([1.0, 0.9]),
                max_tokens=rng.randint(8, 96),
                ignore_eos=True,
                logprobs=rng.choice([None, None, 2]),
            )
            if rng.random() < 0.5:
                prompt: str | list[int] = " ".join(rng.choices(words, k=rng.randint(4, 60)))
            else:
                prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 120))]
            engine.add_request(f"mem-{next_id}", prompt, params)
            next_id += 1
        start = time.perf_counter()
        engine.step()
        step_time += time.perf_counter() - start
        if step % every == 0:
            gc.collect()
            samples.append((step, rss_mb(), 1e3 * step_time / every))
            step_time = 0.0
            if trace:
                import tracemalloc

                if snapshot is None:
                    tracemalloc.start(8)
                else:
                    top = tracemalloc.take_snapshot().compare_to(snapshot, "lineno")
                    heap = tracemalloc.get_traced_memory()[0] / 2**20
                    print(f"  Python heap {heap:.1f} MB at step {step}; where it grew:")
                    for stat in top[:6]:
                        print(f"    {stat}")
                snapshot = tracemalloc.take_snapshot()
    return samples


def run_memory(model: str | None, steps: int, trace: bool) -> list[tuple[int, float, float]]:
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=16, max_num_batched_tokens=512))
    return memory_run(engine, steps, trace=trace)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="checkpoint folder (default: embedded model)")
    parser.add_argument("--load", action="store_true", help="step time with 100 vs 10,000 waiting")
    parser.add_argument("--soak", type=int, default=0, metavar="N", help="soak with N requests")
    parser.add_argument("--steps", type=int, default=30, help="steps timed per queue length")
    parser.add_argument(
        "--memory",
        type=int,
        nargs="?",
        const=3000,
        default=0,
        metavar="STEPS",
        help="RSS over a steady stream of 16 requests for STEPS steps (default 3,000)",
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="with --memory: where the Python heap grew"
    )


def run(args: argparse.Namespace) -> int:
    if args.memory:
        samples = run_memory(args.model, args.memory, args.tracemalloc)
        base = samples[0][1]
        for step, rss, ms in samples:
            print(
                f"memory: step {step:>5}  RSS {rss:7.1f} MB  {100 * (rss - base) / base:+5.1f}%"
                f"  ({ms:.1f} ms/step)"
            )
        if not args.load and not args.soak:
            return 0
    if not args.load and not args.soak:
        args.load, args.soak = True, 2000
    if args.load:
        r = run_load(args.model, args.steps)
        print(
            f"load: step {r['step_ms_100']:.2f} ms with 100 waiting, {r['step_ms_10000']:.2f} ms with "
            f"10,000 (ratio {r['step_ratio']:.2f}); schedule() {r['schedule_us_100']:.0f} us vs "
            f"{r['schedule_us_10000']:.0f} us (ratio {r['schedule_ratio']:.2f})"
        )
    if args.soak:
        r = run_soak(args.model, args.soak)
        print(
            "soak: "
            + ", ".join(
                f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
            )
        )
        if r["free_blocks_after"] != r["free_blocks_before"]:
            print("soak: BLOCKS LEAKED")
            return 1
    return 0
