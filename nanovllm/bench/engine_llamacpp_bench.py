"""llama.cpp's own throughput tool, `llama-batched-bench`, run on the workload's shape.

`llamacpp-batched` drives llama.cpp from a Python step loop; this engine runs llama.cpp's own
C++ loop instead, the figure llama.cpp's authors publish, so the table has llama.cpp with no
Python at all beside it. The tool cannot serve requests: it decodes `-npl N` sequences of
`-npp P` random prompt tokens (one prefill, in batches of `-b`), then `-ntg T` steps of one
token for each, and prints the times of the two phases. So it runs only workloads it can
express, and raises EngineUnavailable for the others:

- every request arrives at 0 (offline), with the same prompt length P and output length T;
- all N requests at once: N <= `--max-num-seqs` (the tool has no queue).

The command is `llama-batched-bench -m FILE -c N*(P+T) -b <max-num-batched-tokens> -npp P
-ntg T -npl N -t/-tb <threads> --output-format jsonl`: one KV stream per sequence (the tool's
default), llama.cpp's micro-batch and attention kernel, in the bench's environment.

What the tool cannot say, the records say plainly (and the row's configuration with them):
no token ids (it feeds random tokens and samples nothing), so each request's ids are -1 and
greedy agreement with nanovllm does not apply; no per-token times, so every request's first
token is stamped at the end of the prompt phase (`t_pp`) and its others evenly over the decode
phase (`t_tg`), the last at the end. The run's wall time is the tool's `t` (both phases, not
its model load).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from nanovllm.bench.child_lifetime import preexec_dying_with_this_process
from nanovllm.bench.engine_llamacpp import bin_dir, server_settings
from nanovllm.bench.engines import Engine, EngineUnavailable, TokenCallback
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.workload import Workload

TOOL = "llama-batched-bench"
NO_TOKEN = -1  # the id recorded for each output token: the tool reports none
TIMEOUT_S = 3600.0


def bench_shape(workload: Workload, max_num_seqs: int) -> tuple[int, int, int]:
    """(P, T, N) of a workload the tool can run; EngineUnavailable (with why) for the others."""
    if any(r.arrival_s > 0 for r in workload.requests):
        raise EngineUnavailable(f"{TOOL} runs offline workloads only (every request at 0)")
    lengths = set(workload.lengths())
    if len(lengths) != 1:
        raise EngineUnavailable(
            f"{TOOL} runs one prompt length and one output length for all requests; "
            f"this workload has {len(lengths)} (prompt, output) pairs"
        )
    (prompt_len, output_len), num_seqs = lengths.pop(), workload.num_requests
    if num_seqs > max_num_seqs:
        raise EngineUnavailable(
            f"{TOOL} runs all {num_seqs} requests at once, over --max-num-seqs {max_num_seqs}"
        )
    return prompt_len, output_len, num_seqs


def bench_command(
    binary: Path, model: Path, shape: tuple[int, int, int], threads: int, batch_size: int
) -> list[str]:
    """The tool's command line for (P, T, N): one KV stream of P + T cells per sequence."""
    prompt_len, output_len, num_seqs = shape
    return [
        str(binary), "-m", str(model), "-c", str(num_seqs * (prompt_len + output_len)),
        "-b", str(batch_size), "-npp", str(prompt_len), "-ntg", str(output_len),
        "-npl", str(num_seqs), "-t", str(threads), "-tb", str(threads),
        "--output-format", "jsonl",
    ]  # fmt: skip


def parse_output(text: str, shape: tuple[int, int, int]) -> dict:
    """The tool's JSON line for (P, T, N) from its standard output, as a dict.

    The tool prints one JSON object per (P, T, N) it ran and skips, silently, one whose KV
    cache does not fit its context; EngineUnavailable when the line is missing."""
    prompt_len, output_len, num_seqs = shape
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if (row.get("pp"), row.get("tg"), row.get("pl")) == shape:
            missing = {"t_pp", "t_tg", "t"} - row.keys()
            if missing:
                raise EngineUnavailable(f"{TOOL}'s line for {shape} lacks {sorted(missing)}")
            return row
    raise EngineUnavailable(
        f"{TOOL} printed no result for -npp {prompt_len} -ntg {output_len} -npl {num_seqs}"
    )


def records_from(row: dict, workload: Workload) -> list[RequestRecord]:
    """Per request: -1 ids, the first token at `t_pp`, the others evenly to `t_pp + t_tg`."""
    t_pp, t_tg = float(row["t_pp"]), float(row["t_tg"])
    records = []
    for r in workload.requests:
        n = r.max_tokens
        times = [t_pp + t_tg * k / (n - 1) for k in range(n)] if n > 1 else [t_pp + t_tg]
        records.append(RequestRecord([NO_TOKEN] * n, times, r.arrival_s))
    return records


class LlamaCppBenchEngine(Engine):
    name = "llamacpp-bench"

    def load(self) -> dict:
        self.model = Path(self.model_path)
        if self.model.suffix != ".gguf" or not self.model.is_file():
            raise EngineUnavailable(f"llama.cpp runs GGUF files only; the model is {self.model}")
        self.binary = bin_dir() / TOOL
        if not self.binary.is_file():
            raise EngineUnavailable(
                f"no {self.binary}; build it with `python -m nanovllm.bench.tools.build_llamacpp` "
                "or set $LLAMACPP_BIN_DIR"
            )
        self.settings = settings = server_settings(self.limits)
        configuration = (
            f"llama.cpp's own {TOOL} (its C++ loop, no Python), weights as stored in the file, "
            f"{settings['threads']} threads, all requests at once, one f16 KV stream each, "
            f"batch {settings['batch_size']}; random prompt tokens and no sampling, so no token "
            "ids (agreement does not apply) and no per-token times (first tokens at the end of "
            "the prompt phase, the rest spread evenly over the decode phase)"
        )
        shown = {k: v for k, v in settings.items() if k not in ("ctx_size", "parallel")}
        return {**shown, "configuration": configuration}

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        shape = bench_shape(workload, self.limits.max_num_seqs)
        command = bench_command(
            self.binary, self.model.resolve(), shape, self.settings["threads"],
            self.settings["batch_size"],
        )  # fmt: skip
        start = time.perf_counter()
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=TIMEOUT_S,
                preexec_fn=preexec_dying_with_this_process(),  # (child_lifetime.py says why)
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise EngineUnavailable(f"{TOOL} ran over {TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise EngineUnavailable(f"{TOOL} exited with {done.returncode}: {' / '.join(tail)}")
        row = parse_output(done.stdout, shape)
        records = records_from(row, workload)
        if on_tokens is not None:
            on_tokens(sum(len(r.token_ids) for r in records))
        extra = {"tool": row, "process_s": time.perf_counter() - start}
        return EngineRun(self.name, float(row["t"]), records, extra)
