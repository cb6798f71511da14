"""Async scheduling, measured: the same requests with and without it, side by side.

`nanovllm bench --async-scheduling` loads the model twice (`async_scheduling=False` and `True`,
everything else equal), runs the same greedy requests on both, interleaved over the repeats
(which side goes first alternates, so a load that drifts weighs on both alike), and
prints the median wall time of each, output tokens per second and their ratio, and whether both
produced the same tokens. Every request generates exactly `max_tokens` tokens (`ignore_eos`),
so both sides run the same steps over the same batches.

`--timeline` also records, for one more run per side, when each step's parts ran
(`perf_counter` seconds): the engine's CPU work (scheduling and building the inputs; making the
outputs: update, detokenize, stops) and the forward pass with sampling. It prints them as two
lanes per side over a window of steady decode steps, and the mean of each part per step:

    plain   main   SS----------------------OO SS----------------------OO
            model  --######################-- --######################--
    async   main   SSOO-------------------- SSOO--------------------
            model  ######################## ########################

With the plain loop the lanes take turns; with async scheduling the main thread's work for
step N+1 (and step N's outputs) runs while the model computes step N.
"""

from __future__ import annotations

import random
import time
from typing import Any

from nanovllm.events import StepSummary

PARTS = ("schedule", "forward", "outputs")  # the timeline's parts, in a step's order


def run(
    model: str = "embedded",
    num_requests: int = 16,
    prompt_len: tuple[int, int] = (32, 128),
    output_len: int = 64,
    repeats: int = 3,
    seed: int = 0,
    timeline: bool = False,
    **engine_options: Any,
) -> dict[str, Any]:
    """Time both sides `repeats` times, interleaved; the figures (and timelines) as a dict."""
    from nanovllm import LLM, SamplingParams
    from nanovllm.bench.models import resolve

    path = resolve(model).path
    sides = {name: LLM(path, async_scheduling=name == "async", seed=seed, dtype="float32",
                       **engine_options) for name in ("plain", "async")}  # fmt: skip
    vocab = sides["plain"].llm_engine.model_args.vocab_size
    rng = random.Random(seed)
    prompts = [
        {"prompt_token_ids": [rng.randrange(vocab) for _ in range(rng.randint(*prompt_len))]}
        for _ in range(num_requests)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for llm in sides.values():  # warm-up: first-call costs stay out of the timings
        llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    times: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list] = {}
    for repeat in range(repeats):
        # Alternate which side goes first (ABBA...): a load that drifts over the run then
        # weighs on both sides alike.
        for name, llm in list(sides.items())[:: -1 if repeat % 2 else 1]:
            llm.llm_engine.reset_prefix_cache()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            times[name].append(time.perf_counter() - start)
            tokens[name] = [o.outputs[0].token_ids for o in outputs]
    num_tokens = num_requests * output_len
    result: dict[str, Any] = {
        "model": model,
        "num_requests": num_requests,
        "prompt_len": list(prompt_len),
        "output_len": output_len,
        "repeats": repeats,
        "sides": {},
        "same_tokens": tokens["plain"] == tokens["async"],
    }
    for name, values in times.items():
        median = sorted(values)[len(values) // 2]
        result["sides"][name] = {
            "seconds": median,
            "all_seconds": values,
            "output_tok_per_s": num_tokens / median,
        }
    result["speedup"] = result["sides"]["plain"]["seconds"] / result["sides"]["async"]["seconds"]
    if timeline:
        result["timelines"] = {}
        for name, llm in sides.items():
            llm.llm_engine.reset_prefix_cache()
            result["timelines"][name] = record_timeline(llm, prompts, params)
    return result


def record_timeline(llm: Any, prompts: list, params: Any) -> list[dict[str, Any]]:
    """One run's steps: per step, (start, end) of each part in seconds from the run's start."""
    engine = llm.llm_engine
    if engine.config.async_scheduling:  # (the overlapped loop records each step's times)
        engine.stats.timeline = steps = []
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        engine.stats.timeline = None
        return [
            {"step": i + 1, **{p: _since(getattr(t, p), start) for p in PARTS}}
            for i, t in enumerate(steps)
        ]
    # The plain loop runs its parts one after another: each step's stats (`engine/stats.py`),
    # read as each step ends (its `StepSummary` event), give the parts' spans backwards from the
    # step's end. (What lies between them, such as a grammar's mask, is counted in the forward.)
    last: list[Any] = []
    unsubscribe = llm.llm_engine.subscribe(
        lambda event: last.append(engine.stats.last) if isinstance(event, StepSummary) else None
    )
    try:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        unsubscribe()
    steps = []
    for i, s in enumerate(last):
        outputs = (s.end - s.outputs_time, s.end)
        forward = (outputs[0] - (s.forward_time - s.prepare_time + s.sample_time), outputs[0])
        inputs = (forward[0] - s.prepare_time, forward[0])
        schedule = (inputs[0] - s.schedule_time, inputs[0])
        spans = {"schedule": schedule, "inputs": inputs, "forward": forward, "outputs": outputs}
        steps.append({"step": i + 1, **{p: _since(span, start) for p, span in spans.items()}})
    return steps


def _since(span: tuple[float, float], start: float) -> tuple[float, float]:
    return (span[0] - start, span[1] - start)


def summary(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Mean milliseconds per step of each part, and of the step period (start to start)."""
    n = max(len(steps), 1)
    means = {p: 1000 * sum(s[p][1] - s[p][0] for s in steps) / n for p in PARTS}
    means["schedule"] += (
        1000 * sum(s["inputs"][1] - s["inputs"][0] for s in steps if "inputs" in s) / n
    )
    if len(steps) > 1:
        period = steps[-1]["forward"][0] - steps[0]["forward"][0]
        means["period"] = 1000 * period / (len(steps) - 1)
    return means


def render(steps: list[dict[str, Any]], first: int, count: int, width: int = 96) -> list[str]:
    """Two text lanes over steps first..first+count-1: the main thread's work (S: schedule and
    inputs, O: outputs) and the model's (#: forward pass and sampling)."""
    window = [s for s in steps if first <= s["step"] < first + count]
    if not window:
        return []
    # From the first forward pass's start to the last one's outputs (parts outside: clipped).
    t0, t1 = window[0]["forward"][0], window[-1]["outputs"][1]
    scale = width / max(t1 - t0, 1e-9)
    main, model = [" "] * width, [" "] * width
    for s in window:
        for part, lane, mark in (("schedule", main, "S"), ("inputs", main, "S"),
                                 ("outputs", main, "O"), ("forward", model, "#")):  # fmt: skip
            if part not in s:
                continue
            a = max(int((s[part][0] - t0) * scale), 0)
            b = max(int((s[part][1] - t0) * scale), a + 1)
            if s[part][1] < t0:
                continue
            for i in range(a, min(b, width)):
                lane[i] = mark
    return ["main  |" + "".join(main) + "|", "model |" + "".join(model) + "|",
            f"       {1000 * (t1 - t0):.1f} ms, steps {first}-{first + count - 1}"]  # fmt: skip


def print_report(result: dict[str, Any]) -> None:
    print(
        f"async scheduling on {result['model']}: {result['num_requests']} requests, prompts "
        f"{result['prompt_len'][0]}-{result['prompt_len'][1]} tokens, {result['output_len']} "
        f"output tokens each, median of {result['repeats']} (interleaved)"
    )
    for name, side in result["sides"].items():
        runs = ", ".join(f"{s:.2f}" for s in side["all_seconds"])
        print(
            f"  {name:<6} {side['seconds']:7.2f} s  {side['output_tok_per_s']:8.1f} output tok/s"
            f"  (runs: {runs})"
        )
    print(f"  async / plain output tok/s: {result['speedup']:.3f}x")
    print(f"  same greedy tokens: {'yes' if result['same_tokens'] else 'NO'}")
    for name, steps in result.get("timelines", {}).items():
        means = summary(steps)
        print(
            f"\n{name}: per step (ms, mean of {len(steps)} steps): schedule+inputs "
            f"{means['schedule']:.2f}, forward+sample {means['forward']:.2f}, outputs "
            f"{means['outputs']:.2f}, step period {means.get('period', 0):.2f}"
        )
        middle = max(len(steps) // 2, 1)
        for line in render(steps, middle, 3):
            print("  " + line)
