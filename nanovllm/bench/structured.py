"""Structured outputs, measured: what the grammar's mask adds to a step, side by side.

`nanovllm bench --structured-outputs` runs the same requests twice on one engine, interleaved
over the repeats: unconstrained, and with every request constrained to a JSON schema. Both
sides generate exactly `max_tokens` tokens per request (`ignore_eos`, and a schema whose
sentences are far longer than that: an object holding an array of at least 1,000 records, so
the grammar never ends an output early), so both run the same number of steps over the same
batch sizes, and the difference in wall time is the mask's: filling each request's bitmask row
from its matcher (`manager.grammar_bitmask`), applying it to the logits (`bitmask.py`) and
advancing the matcher by the sampled token. The schema is compiled once before the timed runs
(a warm-up request), as a server compiles a schema once and serves it from the cache after.

Printed: per side the median wall time, steps and time per step; the ratio constrained /
unconstrained, and the extra milliseconds per step and per constrained token. On a shared
machine the forward pass's noise can hide the mask, so the mask's own work is also timed alone:
the constrained outputs replayed through fresh matchers, each token's fill, apply (to a row of
random logits the model's width) and accept timed, in microseconds per token.
"""

from __future__ import annotations

import time
from typing import Any

# Records of a name, an integer and a flag: keys, strings, numbers and literals in turn.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 1000,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "count": {"type": "integer"},
                    "ok": {"type": "boolean"},
                },
                "required": ["name", "count", "ok"],
            },
        }
    },
    "required": ["records"],
}


def run(
    model: str = "embedded",
    num_requests: int = 16,
    output_len: int = 64,
    repeats: int = 3,
    temperature: float = 0.0,
    seed: int = 0,
    **engine_options: Any,
) -> dict[str, Any]:
    """Time both sides `repeats` times, interleaved; the figures as a dict."""
    from nanovllm import LLM, SamplingParams, StructuredOutputsParams
    from nanovllm.bench.models import resolve

    llm = LLM(resolve(model).path, seed=seed, **engine_options)
    prompts = [f"ROMEO:\nWhat is number {i}?\nJULIET:\n" for i in range(num_requests)]
    constraint = StructuredOutputsParams(json=SCHEMA)

    def params(structured: bool) -> SamplingParams:
        return SamplingParams(
            temperature=temperature, max_tokens=output_len, ignore_eos=True, seed=seed,
            structured_outputs=constraint if structured else None,
        )  # fmt: skip

    llm.generate(prompts[:1], params(True), use_tqdm=False)  # compile the schema once
    times: dict[str, list[float]] = {"unconstrained": [], "json schema": []}
    steps: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for name, structured in (("unconstrained", False), ("json schema", True)):
            engine = llm.llm_engine
            step_before = engine.stats.num_steps
            start = time.perf_counter()
            outputs = llm.generate(prompts, params(structured), use_tqdm=False)
            times[name].append(time.perf_counter() - start)
            steps[name] = engine.stats.num_steps - step_before
            tokens[name] = sum(len(o.outputs[0].token_ids) for o in outputs)
    mask = replay_mask(llm, constraint, outputs)
    sides = {}
    for name, values in times.items():
        median = sorted(values)[len(values) // 2]
        sides[name] = {
            "seconds": median,
            "all_seconds": values,
            "steps": steps[name],
            "tokens": tokens[name],
            "ms_per_step": 1000 * median / steps[name],
        }
    plain, masked = sides["unconstrained"], sides["json schema"]
    return {
        "model": model,
        "num_requests": num_requests,
        "output_len": output_len,
        "repeats": repeats,
        "temperature": temperature,
        "sides": sides,
        "ratio": masked["seconds"] / plain["seconds"],
        "extra_ms_per_step": masked["ms_per_step"] - plain["ms_per_step"],
        "extra_ms_per_token": 1000 * (masked["seconds"] - plain["seconds"]) / masked["tokens"],
        "mask_us_per_token": mask,
    }


def replay_mask(llm: Any, constraint: Any, outputs: list) -> dict[str, float]:
    """Microseconds per token of the mask's three parts, replaying `outputs` (the last
    constrained run's) through fresh matchers, as the engine does for one logits row."""
    import torch

    from nanovllm import SamplingParams
    from nanovllm.engine.eos import eos_token_ids
    from nanovllm.models.loader import load_model_args
    from nanovllm.structured_output.bitmask import GrammarBitmask, apply_grammar_bitmask
    from nanovllm.structured_output.manager import StructuredOutputManager

    engine = llm.llm_engine
    vocab = engine.model_args.vocab_size
    hf_config, _ = load_model_args(engine.model_path)  # (the engine's stop tokens, its way)
    eos = eos_token_ids(engine.model_path, hf_config, engine.tokenizer)
    manager = StructuredOutputManager(engine.tokenizer, vocab, eos)  # the engine's kind
    params = SamplingParams(structured_outputs=constraint)
    parts = {"fill": 0.0, "apply": 0.0, "accept": 0.0}
    count = 0
    logits = torch.randn(1, vocab)
    for output in outputs:
        request = manager.grammar_init(params)
        request.compiled.result()  # (compiled once, in the background, then cached)
        manager.grammar_ready(request)
        grammar = request.grammar
        bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
        for token in output.outputs[0].token_ids:
            t0 = time.perf_counter()
            grammar.fill_bitmask(bitmask, 0)
            t1 = time.perf_counter()
            apply_grammar_bitmask(logits, GrammarBitmask([0], bitmask))
            t2 = time.perf_counter()
            assert grammar.accept_token(token)
            t3 = time.perf_counter()
            parts["fill"] += t1 - t0
            parts["apply"] += t2 - t1
            parts["accept"] += t3 - t2
            count += 1
    return {name: 1e6 * seconds / count for name, seconds in parts.items()}


def print_report(result: dict[str, Any]) -> None:
    print(
        f"structured outputs on {result['model']}: {result['num_requests']} requests x "
        f"{result['output_len']} tokens, temperature {result['temperature']}, median of "
        f"{result['repeats']} interleaved repeats"
    )
    print(f"{'side':<15}{'seconds':>9}{'steps':>7}{'tokens':>8}{'ms/step':>9}")
    for name, side in result["sides"].items():
        print(
            f"{name:<15}{side['seconds']:>9.3f}{side['steps']:>7}{side['tokens']:>8}"
            f"{side['ms_per_step']:>9.2f}"
        )
    print(
        f"json schema / unconstrained: {result['ratio']:.3f}x wall time; the mask adds "
        f"{result['extra_ms_per_step']:.2f} ms per step, {result['extra_ms_per_token']:.3f} ms "
        "per constrained token"
    )
    mask = result["mask_us_per_token"]
    print(
        f"the mask alone, per token: fill {mask['fill']:.0f} us, apply {mask['apply']:.0f} us, "
        f"accept {mask['accept']:.0f} us ({sum(mask.values()):.0f} us in all)"
    )
