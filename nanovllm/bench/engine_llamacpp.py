"""llama.cpp on the very GGUF file nanovllm loads: `llama-server`'s continuous batching over HTTP.

A user with a CPU and a GGUF file would otherwise reach for llama.cpp, so the bench runs it on
the same file, with the same requests. It is not one of nanovllm's peers by design (no paged
KV cache, no prefix sharing across requests here), so it runs in llama.cpp's own recommended CPU
configuration rather than under nanovllm's limits, and the report prints that configuration:

- `llama-server` (built by `python -m nanovllm.bench.tools.build_llamacpp`; found in
  `$LLAMACPP_BIN_DIR`, by default `<tempdir>/llamacpp/build/bin`), weights as stored in the file;
- `-t`/`-tb`: the bench's `--threads` for decode and for prompt batches, else every CPU
  (llama.cpp's docs: one thread per core);
- `--parallel N` slots, N = `--max-num-seqs` (or the workload's requests, if fewer),
  continuously batched (llama.cpp's default), each slot with a KV stream of its own as long as
  the workload's longest request (`--ctx-size` N x that, which llama.cpp splits among the slots),
  in llama.cpp's own f16 KV format, as `llamacpp-batched` makes its context. So the server is
  started in `run`, for the workload's shape (and again only when a workload needs another).
  Not one unified cache (`--kv-unified`): in a unified cache every token attends over every
  sequence's cells, masked, which took 1.7x the CPU time (nanovllm/bench/README.md, "Why
  `llamacpp-batched` took twice the tool's time"); one stream per sequence is llama.cpp's
  default. Nor N x max_model_len: at the bench's 64 slots of 8,192 tokens that is 12 GB of KV;
- `-b`: `--max-num-batched-tokens` (tokens per decode call); `-ub` and attention are left to
  llama.cpp;
- no prompt cache (`--cache-ram 0`, `cache_prompt: false`), no web UI.

Each request is one streamed `POST /completion` with its prompt as token ids (so no BOS is
added), `n_predict` = its output length and `ignore_eos`; greedy is `top_k` = 1 alone. Tokens
are stamped when their server-sent event arrives, one client thread per request (which waits
for its arrival time), so the times match what the other engines stamp. A request's tokens are
cut to `max_tokens`: the server may send one more when a token ends mid-UTF-8 character.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from nanovllm.bench.child_lifetime import preexec_dying_with_this_process
from nanovllm.bench.engines import Engine, EngineLimits, EngineUnavailable, TokenCallback
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.workload import BenchRequest, Workload

SERVER = "llama-server"
STARTUP_TIMEOUT_S = 300.0


def bin_dir() -> Path:
    """Where the llama.cpp binaries are: `$LLAMACPP_BIN_DIR`, else the build script's output."""
    default = Path(tempfile.gettempdir()) / "llamacpp" / "build" / "bin"
    return Path(os.environ.get("LLAMACPP_BIN_DIR", default))


def server_settings(
    limits: EngineLimits, num_seqs: int | None = None, seq_len: int | None = None
) -> dict[str, int]:
    """llama-server's sizes for the bench's limits and a workload of `num_seqs` requests of at
    most `seq_len` tokens (the module docstring says why each; without a workload, the limits'
    `max_num_seqs` and `max_model_len`). The other llama.cpp engines take their threads and
    batch size from here too."""
    threads = limits.threads or os.cpu_count() or 1
    parallel = min(limits.max_num_seqs, num_seqs or limits.max_num_seqs)
    seq_len = seq_len or limits.max_model_len
    return {"threads": threads, "parallel": parallel, "ctx_size": parallel * seq_len,
            "batch_size": limits.max_num_batched_tokens}  # fmt: skip


def server_command(binary: Path, model: Path, port: int, settings: dict[str, int]) -> list[str]:
    """The `llama-server` command line."""
    return [
        str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(settings["threads"]), "--threads-batch", str(settings["threads"]),
        "--parallel", str(settings["parallel"]), "--cont-batching",
        "--ctx-size", str(settings["ctx_size"]), "--batch-size", str(settings["batch_size"]),
        "--cache-ram", "0", "--no-webui",
    ]  # fmt: skip


def completion_request(request: BenchRequest, temperature: float) -> dict:
    """The `/completion` body for one bench request: token ids in, token ids streamed out."""
    body = {
        "prompt": list(request.prompt_token_ids),
        "n_predict": request.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "return_tokens": True,
        "cache_prompt": False,
    }
    if temperature == 0.0:
        body.update(samplers=["top_k"], top_k=1)  # argmax and nothing else
    else:
        body.update(samplers=["temperature"], temperature=temperature)
        if request.seed is not None:
            body["seed"] = request.seed
    return body


def parse_event(line: bytes) -> dict | None:
    """One line of the server-sent event stream: its JSON object, or None for other lines.

    Raises EngineUnavailable on an `error:` line or an event that carries an error."""
    text = line.decode("utf-8").strip()
    if text.startswith("error:"):
        raise EngineUnavailable(f"llama-server: {text[len('error:') :].strip()}")
    if not text.startswith("data:"):
        return None
    payload = text[len("data:") :].strip()
    if payload == "[DONE]":
        return None
    event = json.loads(payload)
    if "error" in event:
        raise EngineUnavailable(f"llama-server: {event['error']}")
    return event


def stream_tokens(lines, clock) -> tuple[list[int], list[float], dict]:
    """Token ids and their times from an event stream, and the final event (timings).

    `lines` yields the stream's raw lines; `clock()` stamps each event's tokens as it arrives.
    In streaming mode the final event (`"stop": true`) carries no tokens of its own."""
    tokens: list[int] = []
    times: list[float] = []
    for line in lines:
        event = parse_event(line)
        if event is None:
            continue
        new = event.get("tokens") or []
        tokens.extend(new)
        times.extend([clock()] * len(new))
        if event.get("stop"):
            return tokens, times, event
    raise EngineUnavailable(
        f"llama-server's stream ended before its last event ({len(tokens)} tokens)"
    )


class LlamaCppEngine(Engine):
    name = "llamacpp"
    proc: subprocess.Popen | None = None

    def load(self) -> dict:
        model = Path(self.model_path)
        if model.suffix != ".gguf" or not model.is_file():
            raise EngineUnavailable(f"llama.cpp runs GGUF files only; the model is {model}")
        binary = bin_dir() / SERVER
        if not binary.is_file():
            raise EngineUnavailable(
                f"no {binary}; build it with `python -m nanovllm.bench.tools.build_llamacpp` "
                "or set $LLAMACPP_BIN_DIR"
            )
        self.binary, self.model = binary, model.resolve()
        self.settings: dict[str, int] | None = None
        threads = self.limits.threads or os.cpu_count() or 1
        configuration = (
            f"llama-server, weights as stored in the file, {threads} threads, up to "
            f"--parallel {self.limits.max_num_seqs} continuous batching, one f16 KV stream per "
            f"slot as long as the workload's longest request, batch "
            f"{self.limits.max_num_batched_tokens}, no prompt cache"
        )
        return {"threads": threads, "configuration": configuration}

    def serve_workload(self, workload: Workload) -> None:
        """A server sized for `workload` (the one running, if it is)."""
        settings = server_settings(self.limits, workload.num_requests, workload.max_seq_len)
        if settings == self.settings:
            return
        self.close()
        self.port = _free_port()
        self.command = server_command(self.binary, self.model, self.port, settings)
        fd, self.log = tempfile.mkstemp(prefix="nanovllm-bench-llamacpp-", suffix=".log")
        self.proc = subprocess.Popen(
            self.command, stdout=fd, stderr=fd, stdin=subprocess.DEVNULL,
            preexec_fn=preexec_dying_with_this_process(),  # (child_lifetime.py says why)
        )  # fmt: skip
        os.close(fd)
        self._wait_healthy()
        self.settings = settings

    def _connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineUnavailable(f"llama-server exited ({self._log_tail()})")
            try:
                conn = self._connection(timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise EngineUnavailable(f"llama-server not ready after {STARTUP_TIMEOUT_S:.0f} s")

    def _log_tail(self) -> str:
        lines = Path(self.log).read_text(errors="replace").strip().splitlines()[-3:]
        return f"{' | '.join(lines)} ({self.log})"

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        self.serve_workload(workload)
        n = workload.num_requests
        results: list[tuple[list[int], list[float], dict] | BaseException | None] = [None] * n
        lock = threading.Lock()
        start = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - start

        def serve(i: int) -> None:
            req = workload.requests[i]
            time.sleep(max(0.0, req.arrival_s - clock()))
            try:
                conn = self._connection()
                body = json.dumps(completion_request(req, workload.temperature))
                conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                if response.status != 200:
                    text = response.read().decode(errors="replace")[:300]
                    raise EngineUnavailable(f"llama-server answered {response.status}: {text}")
                results[i] = stream_tokens(iter(response.readline, b""), clock)
                conn.close()
            except BaseException as exc:  # reraised in the caller's thread
                results[i] = exc
            if on_tokens is not None and not isinstance(results[i], BaseException):
                with lock:
                    on_tokens(min(len(results[i][0]), req.max_tokens))

        threads = [threading.Thread(target=serve, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, EngineUnavailable):
                    raise result
                raise EngineUnavailable(f"llama-server request failed: {result!r}") from result
        records = [
            RequestRecord(tokens[: r.max_tokens], times[: r.max_tokens], r.arrival_s)
            for r, (tokens, times, _) in zip(workload.requests, results)
        ]
        wall = max((rec.token_times[-1] for rec in records if rec.token_times), default=0.0)
        return EngineRun(self.name, wall, records)

    def close(self) -> None:
        self.settings = None
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
