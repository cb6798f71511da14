"""vLLM's side of the benchmark: a worker run by vLLM's own Python, spoken to in JSON lines.

    -> {"cmd": "load", "model": PATH, "max_num_seqs": 64, ...}   <- {"ok": true, "info": {...}}
    -> {"cmd": "run", "workload": {...}}                          <- {"ok": true, "run": {...}}
    -> {"cmd": "quit"}

Requests go in as token ids (`skip_tokenizer_init`), with `ignore_eos` and exactly the asked
`max_tokens`, and are served by `steploop.drive`, the same loop and clock that time nanovllm.
The run dict has the shape of `nanovllm.bench.records.EngineRun`.

Run as a script, so nanovllm (not installed in vLLM's environment) is never imported; Python
puts this file's folder first on `sys.path`, which is how `steploop` (standard library only) is
found. Replies go to the original stdout, reserved for them; everything vLLM prints goes to
stderr. vLLM starts its worker processes with "spawn", which re-imports the main module: hence
the `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from steploop import drive


def load(cmd: dict):
    import vllm

    args = vllm.EngineArgs(
        model=cmd["model"],
        dtype="float32",
        skip_tokenizer_init=True,
        seed=cmd["seed"],
        max_num_seqs=cmd["max_num_seqs"],
        max_num_batched_tokens=cmd["max_num_batched_tokens"],
        max_model_len=cmd["max_model_len"],
        block_size=-(-cmd["block_size"] // 32) * 32,  # vLLM's CPU attention: multiples of 32
        enable_prefix_caching=True,
        enforce_eager=cmd["enforce_eager"],
        # Without an explicit size, vLLM on a CPU wants 92% of RAM free at start-up.
        kv_cache_memory_bytes=cmd["kv_cache_memory_bytes"],
    )
    start = time.perf_counter()
    engine = vllm.LLMEngine.from_engine_args(args)
    info = {
        "version": vllm.__version__,
        "load_s": time.perf_counter() - start,
        "enforce_eager": args.enforce_eager,
        "block_size": args.block_size,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "reserved_cpus": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # (None: OpenMP's default)
    }
    return engine, info


def run(engine, workload: dict) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine.reset_prefix_cache()  # a repeat must not find the previous repeat's prompts cached
    requests = workload["requests"]

    def add(i: int) -> None:
        r = requests[i]
        params = SamplingParams(
            temperature=workload["temperature"],
            max_tokens=r["max_tokens"],
            # ignore_eos alone: EOS may be generated and generation goes on, as in every other
            # engine (min_tokens would instead *ban* EOS, changing greedy outputs).
            ignore_eos=True,
            seed=r["seed"],
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        engine.add_request(str(i), {"prompt_token_ids": r["prompt_token_ids"]}, params)

    def step():
        return [(int(o.request_id), list(o.outputs[0].token_ids)) for o in engine.step()]

    arrivals = [r["arrival_s"] for r in requests]
    preempted = num_preemptions(engine)
    _, wall, tokens, times = drive(arrivals, add, step, engine.has_unfinished_requests)
    if preempted is not None:
        preempted = num_preemptions(engine) - preempted
    records = [
        {
            "token_ids": tokens[i][: r["max_tokens"]],
            "token_times": times[i][: r["max_tokens"]],
            "arrival_s": r["arrival_s"],
        }
        for i, r in enumerate(requests)
    ]
    extra = {"num_preemptions": preempted}
    return {"engine": "vllm", "wall_s": wall, "records": records, "extra": extra}


def num_preemptions(engine) -> int | None:
    """The preemptions vLLM has counted so far (its `vllm:num_preemptions` counter); None from
    a vLLM without the counter."""
    if not hasattr(engine, "get_metrics"):
        return None
    return int(sum(m.value for m in engine.get_metrics() if m.name == "vllm:num_preemptions"))


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")  # the real stdout, for replies only
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    engine = None
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "load":
                engine, info = load(cmd)
                reply = {"ok": True, "info": info}
            elif cmd["cmd"] == "run":
                reply = {"ok": True, "run": run(engine, cmd["workload"])}
            elif cmd["cmd"] == "quit":
                break
            else:
                reply = {"ok": False, "error": f"unknown command {cmd['cmd']!r}"}
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which skips vLLM
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc(file=sys.stderr)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
