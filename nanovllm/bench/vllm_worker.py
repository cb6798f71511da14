"""vLLM's side of the benchmark: a worker run by vLLM's own Python, spoken to in JSON lines.

vLLM's CPU build pins its own torch and transformers, so it lives in a separate virtualenv and
cannot be imported next to nanovllm. The bench starts this file with that environment's
interpreter and keeps it alive for the whole run, so the model is loaded once, before any
timing, and vLLM's repeats interleave with the other engines' (A B C A B C):

    -> {"cmd": "load", "model": PATH, "max_num_seqs": 64, ...}   <- {"ok": true, "info": {...}}
    -> {"cmd": "run", "workload": {...}}                          <- {"ok": true, "run": {...}}
    -> {"cmd": "quit"}

Requests go in as token ids (`skip_tokenizer_init`), with `ignore_eos` and exactly the asked
`max_tokens`; each token's time is taken when `LLMEngine.step()` hands it over, the same way
the bench times nanovllm. The run dict has the shape of `nanovllm.bench.records.EngineRun`.

Standalone on purpose: it imports nothing from nanovllm (not installed in vLLM's environment).
Replies go to the original stdout, which is reserved for them; everything vLLM prints is sent
to stderr. vLLM starts worker processes with "spawn", which re-imports the main module: hence
the `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _load(cmd: dict):
    from vllm import EngineArgs, LLMEngine

    args = EngineArgs(
        model=cmd["model"],
        dtype="float32",
        skip_tokenizer_init=True,
        seed=cmd.get("seed", 0),
        max_num_seqs=cmd["max_num_seqs"],
        max_num_batched_tokens=cmd["max_num_batched_tokens"],
        max_model_len=cmd["max_model_len"],
        # vLLM's CPU attention needs blocks of a multiple of 32 tokens.
        block_size=-(-cmd.get("block_size", 32) // 32) * 32,
        enable_prefix_caching=cmd.get("enable_prefix_caching", True),
        enforce_eager=cmd.get("enforce_eager", False),
        # Without an explicit size, vLLM on a CPU wants 92% of RAM free at start-up.
        kv_cache_memory_bytes=cmd.get("kv_cache_memory_bytes") or 2**30,
    )
    start = time.perf_counter()
    engine = LLMEngine.from_engine_args(args)
    import vllm

    info = {
        "version": vllm.__version__,
        "load_s": time.perf_counter() - start,
        "enforce_eager": cmd.get("enforce_eager", False),
        "block_size": args.block_size,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
    }
    return engine, info


def _run(engine, workload: dict) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine.reset_prefix_cache()  # a repeat must not find the previous repeat's prompts cached
    requests = workload["requests"]
    temperature = workload.get("temperature", 0.0)
    params = [
        SamplingParams(
            temperature=temperature,
            top_p=workload.get("top_p", 1.0),
            max_tokens=r["max_tokens"],
            # ignore_eos alone: EOS may be generated and generation goes on, as in every other
            # engine. (min_tokens would instead *ban* EOS, changing greedy outputs.)
            ignore_eos=True,
            seed=r.get("seed"),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        for r in requests
    ]
    tokens: list[list[int]] = [[] for _ in requests]
    times: list[list[float]] = [[] for _ in requests]
    order = sorted(range(len(requests)), key=lambda i: requests[i]["arrival_s"])
    nxt = 0
    start = time.perf_counter()
    while nxt < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while nxt < len(order) and requests[order[nxt]]["arrival_s"] <= now:
            i = order[nxt]
            prompt = {"prompt_token_ids": requests[i]["prompt_token_ids"]}
            engine.add_request(str(i), prompt, params[i])
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, requests[order[nxt]]["arrival_s"] - now))
            continue
        for out in engine.step():
            i = int(out.request_id)
            new = list(out.outputs[0].token_ids)
            t = time.perf_counter() - start
            tokens[i].extend(new)
            times[i].extend([t] * len(new))
    wall = time.perf_counter() - start
    records = []
    for i, r in enumerate(requests):
        n = r["max_tokens"]
        records.append(
            {"token_ids": tokens[i][:n], "token_times": times[i][:n], "arrival_s": r["arrival_s"]}
        )
    return {"engine": "vllm", "wall_s": wall, "records": records, "extra": {}}


def main() -> None:
    # Keep the real stdout for replies; send everything else (vLLM's logs, prints) to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    engine = None
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "load":
                engine, info = _load(cmd)
                reply = {"ok": True, "info": info}
            elif cmd["cmd"] == "run":
                reply = {"ok": True, "run": _run(engine, cmd["workload"])}
            elif cmd["cmd"] == "quit":
                break
            else:
                reply = {"ok": False, "error": f"unknown command {cmd['cmd']!r}"}
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which decides
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc(file=sys.stderr)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
