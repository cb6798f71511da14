"""Disaggregated prefill/decode, measured: what it removes (prefill's interference with decode)
and what it costs, co-located and disaggregated side by side in one run.

`nanovllm bench --disagg` starts, on this machine's first two cores (pinned_servers.py):

    co-located       one `nanovllm serve` on both cores, 2 threads
    disaggregated    a producer (`kv_producer`) on core 0 and a consumer (`kv_consumer`) on
                     core 1, 1 thread each, a P2pConnector between them (kv_transfer/p2p.py),
                     and in front of them `nanovllm serve --disagg-proxy` (not pinned)

Each run of a setup: `num_steady` streaming requests with short prompts and long outputs start;
once each has `warm_tokens` tokens, `num_burst` long prompts arrive at once (streaming too, each
asking `burst_output_len` tokens). The *burst window* runs from when the burst was sent to the
last burst token. Measured per run, on the client's clock (one stream per thread, each chunk
stamped as it arrives):

- ITL of the steady requests in the window: the gaps between successive chunks of a stream
  whose later chunk arrived in the window (vLLM's bench also takes one gap per chunk); p50, p99
  and max. Beside it the steady requests' ITL p50 before the burst: the decode rate at rest.
- TTFT of the burst requests: from sending one to its first chunk (through the proxy: prefill,
  transfer and the consumer's first step); p50 and p99.
- output tok/s: every output token (steady and burst) that arrived in the window, over the
  window. Tokens are counted from `logprobs: 0` (one entry per token; a chunk can carry several
  when the client falls behind), which every request asks for.
- the consumer's `vllm:external_prefix_cache_hits_total` (GET /metrics) over the run:
  prompt tokens it loaded from the producer instead of computing them.

The steady requests are then cancelled (closing their streams aborts them on the server). The
runs alternate (co-located, disaggregated, co-located, ...) for `repeats` rounds, each on an idle
machine (quiet.py), each round with prompts of its own (a prefix cache must find nothing); ITL
and TTFT pool every run of a setup, tok/s is the median over its runs. Greedy, EOS ignored: both
setups must produce the same text for every burst request, and for every steady request up to
where the shorter of the two was cancelled.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from nanovllm.bench import quiet, stats
from nanovllm.bench.models import resolve
from nanovllm.bench.pinned_servers import ServerGroup, free_port
from nanovllm.bench.report import _ms, _ratio, _table, _tok_s_range
from nanovllm.bench.suite import Progress
from nanovllm.bench.workload import _ids, _rng

COLOCATED, DISAGG = "co-located", "disaggregated"
# Streams of their own (workload.py's are 0-5, multi_turn.py's 6-8).
_STEADY_TOKENS, _BURST_LENGTHS, _BURST_TOKENS = 9, 10, 11
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
RUNNING = "vllm:num_requests_running"


# --- the workload -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DisaggWorkload:
    steady_prompts: list[list[int]]
    steady_max_tokens: int  # more than a run lasts: the steady requests are cancelled
    burst_prompts: list[list[int]]
    burst_output_len: int
    warm_tokens: int  # tokens every steady request has before the burst is sent

    @property
    def burst_prompt_tokens(self) -> int:
        return sum(map(len, self.burst_prompts))

    def loadable_tokens(self, block_size: int) -> int:
        """Prompt tokens a consumer can load rather than compute: every full block but the
        one holding the prompt's last token (computed: it gives the first output token)."""
        prompts = self.steady_prompts + self.burst_prompts
        return sum((len(p) - 1) // block_size * block_size for p in prompts)


def disagg_workload(
    num_steady: int,
    steady_prompt_len: int,
    num_burst: int,
    burst_prompt_len: tuple[int, int],
    burst_output_len: int,
    vocab_size: int,
    max_model_len: int,
    seed: int = 0,
    warm_tokens: int = 32,
) -> DisaggWorkload:
    """Token ids drawn uniformly from the vocabulary (workload.py's `_ids`), burst prompt
    lengths uniform in their (inclusive) range; steady outputs as long as `max_model_len`
    allows."""
    if burst_prompt_len[1] + burst_output_len > max_model_len:
        raise ValueError(
            f"burst requests reach {burst_prompt_len[1] + burst_output_len} tokens, more than "
            f"max_model_len={max_model_len}: shorter --prompt-len or --output-len"
        )
    steady_max_tokens = max_model_len - steady_prompt_len
    if steady_max_tokens <= warm_tokens:
        raise ValueError(f"max_model_len={max_model_len} leaves the steady requests no room")
    ids, lengths = _rng(seed, _STEADY_TOKENS), _rng(seed, _BURST_LENGTHS)
    burst_ids = _rng(seed, _BURST_TOKENS)
    steady = [_ids(ids, steady_prompt_len, vocab_size) for _ in range(num_steady)]
    burst = [
        _ids(burst_ids, lengths.randint(*burst_prompt_len), vocab_size) for _ in range(num_burst)
    ]
    return DisaggWorkload(steady, steady_max_tokens, burst, burst_output_len, warm_tokens)


# --- one stream -------------------------------------------------------------------------------


@dataclass
class StreamRecord:
    """What the client saw of one streaming request; times in seconds since the run began."""

    sent: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens in it)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


class Stream:
    """One streaming POST, read on its own thread; `cancel()` closes its connection."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(2)  # SHUT_RDWR: the reading thread's readline returns
            except OSError:
                pass


def _connection(url: str, timeout: float = 600.0) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def post_json(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """A non-streaming POST; the JSON answer (RuntimeError on a status other than 200)."""
    conn = _connection(url, timeout)
    try:
        conn.request("POST", urlsplit(url).path, json.dumps(body), _JSON)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"POST {url}: {response.status} {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


_JSON = {"Content-Type": "application/json"}


def read_stream(
    url: str,
    body: dict[str, Any],
    record: StreamRecord,
    clock: Callable[[], float],
    stream: Stream,
    on_chunk: Callable[[StreamRecord], None] | None = None,
) -> None:
    """POST `body` (streaming) to `url` and fill `record` chunk by chunk until the stream ends,
    breaks or is cancelled; an error is kept in `record.error`, not raised."""
    conn = stream.conn
    try:
        conn.request("POST", urlsplit(url).path, json.dumps(body), _JSON)
        response = conn.getresponse()
        if response.status != 200:
            record.error = f"{response.status} {response.read()[:300]!r}"
            return
        while True:
            line = response.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            now = clock()
            chunk = json.loads(payload)
            if "error" in chunk:
                record.error = str(chunk["error"])
                break
            for choice in chunk.get("choices", []):
                tokens = len((choice.get("logprobs") or {}).get("tokens") or [])
                if tokens:
                    record.chunks.append((now, tokens))
                record.text += choice.get("text") or ""
                record.finish_reason = choice.get("finish_reason") or record.finish_reason
            if on_chunk is not None:
                on_chunk(record)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if not stream.cancelled:
            record.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


# --- one run of one setup ---------------------------------------------------------------------


@dataclass
class RunRecord:
    steady: list[StreamRecord]
    burst: list[StreamRecord]
    burst_start: float
    external_hits: int | None = None  # the consumer's, over the run (disaggregated only)


def _body(prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "logprobs": 0,  # one entry per token: the client counts tokens exactly
    }


def drive(url: str, workload: DisaggWorkload) -> RunRecord:
    """One run (module docstring) against the OpenAI server (or proxy) at `url`."""
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    warm = threading.Condition()

    def on_chunk(_: StreamRecord) -> None:
        with warm:
            warm.notify_all()

    def launch(
        prompt: list[int], max_tokens: int, notify
    ) -> tuple[StreamRecord, Stream, threading.Thread]:
        record, stream = StreamRecord(sent=clock()), Stream(_connection(url))
        body = _body(prompt, max_tokens)
        args = (url + "/v1/completions", body, record, clock, stream, notify)
        thread = threading.Thread(target=read_stream, args=args, daemon=True)
        thread.start()
        return record, stream, thread

    steady = [launch(p, workload.steady_max_tokens, on_chunk) for p in workload.steady_prompts]
    try:
        with warm:
            ready = lambda: all(  # noqa: E731
                r.num_tokens >= workload.warm_tokens or r.error or not t.is_alive()
                for r, _, t in steady
            )
            if not warm.wait_for(ready, timeout=300):
                raise RuntimeError("the steady requests did not start within 300 s")
        if errors := [r.error for r, _, _ in steady if r.error]:
            raise RuntimeError(f"a steady request failed: {errors[0]}")
        burst_start = clock()
        burst = [launch(p, workload.burst_output_len, None) for p in workload.burst_prompts]
        for _, _, thread in burst:
            thread.join()
    finally:
        for _, stream, _ in steady:
            stream.cancel()
        for _, _, thread in steady:
            thread.join(10)
    if errors := [r.error for r, _, _ in burst if r.error]:
        raise RuntimeError(f"a burst request failed: {errors[0]}")
    return RunRecord([r for r, _, _ in steady], [r for r, _, _ in burst], burst_start)


# --- figures (pure functions of the records) --------------------------------------------------


def gaps(times: list[float], start: float, end: float) -> list[float]:
    """Gaps between successive times whose later time lies in (start, end]."""
    return [b - a for a, b in zip(times, times[1:]) if start < b <= end]


def run_figures(run: RunRecord) -> dict[str, Any]:
    """One run's raw figures: the window, steady gaps before and in it, burst TTFTs, tokens."""
    end = max(r.chunks[-1][0] for r in run.burst)
    itl_burst, itl_before = [], []
    for r in run.steady:
        times = [t for t, _ in r.chunks]
        itl_burst += gaps(times, run.burst_start, end)
        itl_before += gaps(times, -math.inf, run.burst_start)
    tokens = sum(
        n for r in run.steady + run.burst for t, n in r.chunks if run.burst_start < t <= end
    )
    window = end - run.burst_start
    return {
        "window_s": window,
        "itl_burst": itl_burst,
        "itl_before": itl_before,
        "ttft": [r.chunks[0][0] - r.sent for r in run.burst],
        "tokens": tokens,
        "tok_s": tokens / window if window > 0 else math.nan,
        "external_hits": run.external_hits,
    }


def setup_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A setup's figures over its runs (`run_figures`'s): latencies pooled, tok/s by median."""
    pool = lambda key: [x for r in runs for x in r[key]]  # noqa: E731
    itl, before, ttft = pool("itl_burst"), pool("itl_before"), pool("ttft")
    hits = [r["external_hits"] for r in runs if r["external_hits"] is not None]
    return {
        "itl_before_p50": stats.percentile(before, 50),
        "itl_p50": stats.percentile(itl, 50),
        "itl_p99": stats.percentile(itl, 99),
        "itl_max": max(itl) if itl else math.nan,
        "ttft_p50": stats.percentile(ttft, 50),
        "ttft_p99": stats.percentile(ttft, 99),
        "tok_s": stats.summary([r["tok_s"] for r in runs]),
        "window_s": stats.summary([r["window_s"] for r in runs]),
        "num_gaps": len(itl),
        "external_hits": sum(hits) if hits else None,
    }


RATIO_KEYS = ("itl_before_p50", "itl_p50", "itl_p99", "itl_max", "ttft_p50", "ttft_p99")


def ratios(colocated: dict[str, Any], disagg: dict[str, Any]) -> dict[str, float | None]:
    """disaggregated / co-located, figure by figure (tok/s: the medians); None over zero."""

    def ratio(a: float, b: float) -> float | None:
        return a / b if b and not math.isnan(b) else None

    out = {k: ratio(disagg[k], colocated[k]) for k in RATIO_KEYS}
    out["window_s"] = ratio(disagg["window_s"]["median"], colocated["window_s"]["median"])
    out["tok_s"] = ratio(disagg["tok_s"]["median"], colocated["tok_s"]["median"])
    return out


def outputs_agree(a: RunRecord, b: RunRecord) -> bool:
    """Burst texts equal; each steady text a prefix of the other's (both were cancelled)."""
    if [r.text for r in a.burst] != [r.text for r in b.burst]:
        return False
    return all(x.text.startswith(y.text) or y.text.startswith(x.text)
               for x, y in zip(a.steady, b.steady))  # fmt: skip


# --- servers ----------------------------------------------------------------------------------


def read_metric(url: str, name: str) -> float:
    """The sum of `name`'s samples on the server's GET /metrics (0 when it has none)."""
    conn = _connection(url, 10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_until_drained(urls: list[str], timeout_s: float = 30.0) -> None:
    """Until no server runs a request (the cancelled ones aborted), or `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(read_metric(u, RUNNING) == 0 for u in urls):
            return
        time.sleep(0.1)


@dataclass
class Setup:
    name: str
    url: str  # where the client sends its requests
    engines: list[str]  # the engines' servers (drained between runs)
    consumer: str | None = None  # disaggregated: whose external hits count


def start_setups(
    group: ServerGroup, engine_args: list[str], cores: tuple[int, int]
) -> tuple[Setup, Setup]:
    """Both setups' servers, started together, ready when this returns."""
    colocated = group.start("colocated", engine_args, cores)
    kv_port = free_port()
    role = lambda r: json.dumps(  # noqa: E731
        {"kv_connector": "P2pConnector", "kv_role": r, "kv_port": kv_port}
    )
    producer = group.start(
        "producer", [*engine_args, "--kv-transfer-config", role("kv_producer")], cores[:1]
    )
    consumer = group.start(
        "consumer", [*engine_args, "--kv-transfer-config", role("kv_consumer")], cores[1:]
    )
    proxy = group.start(
        "proxy", ["--disagg-proxy", "--prefill", producer.url, "--decode", consumer.url], None
    )
    disagg = Setup(DISAGG, proxy.url, [producer.url, consumer.url], consumer.url)
    group.wait_ready()
    return Setup(COLOCATED, colocated.url, [colocated.url]), disagg


def timed_run(setup: Setup, workload: DisaggWorkload) -> RunRecord:
    """One run on an idle machine, with the consumer's external hits over it."""
    wait_until_drained(setup.engines)
    quiet.wait_until_idle()
    hits = read_metric(setup.consumer, EXTERNAL_HITS) if setup.consumer else None
    record = drive(setup.url, workload)
    if setup.consumer:
        record.external_hits = int(read_metric(setup.consumer, EXTERNAL_HITS) - hits)
    return record


# --- the bench --------------------------------------------------------------------------------


def run(
    model: str = "embedded",
    num_steady: int = 4,
    steady_prompt_len: int = 16,
    num_burst: int = 8,
    burst_prompt_len: tuple[int, int] = (512, 512),
    burst_output_len: int = 16,
    warm_tokens: int = 32,
    repeats: int = 3,
    seed: int = 0,
    block_size: int = 16,
    max_num_batched_tokens: int = 2048,
    max_model_len: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Both setups, `repeats` rounds, interleaved; the figures as a dict (module docstring)."""
    progress = progress or Progress()
    cores = tuple(sorted(os.sched_getaffinity(0)))[:2]
    if len(cores) < 2:
        raise ValueError("--disagg pins its engines to two cores; this process may use one")
    info = resolve(model)
    max_model_len = min(max_model_len or info.max_position, info.max_position)

    def workload(round_: int) -> DisaggWorkload:  # each round its own prompts
        return disagg_workload(
            num_steady, steady_prompt_len, num_burst, burst_prompt_len, burst_output_len,
            info.vocab_size, max_model_len, seed * 1000 + round_, warm_tokens,
        )  # fmt: skip

    # Room for every request of a run at its longest, and the block the last token may open.
    per_seq = lambda n: math.ceil(n / block_size) + 1  # noqa: E731
    num_kv_blocks = num_steady * per_seq(max_model_len) + num_burst * per_seq(
        burst_prompt_len[1] + burst_output_len
    )
    engine_args = [
        *([] if model == "embedded" else [info.path]),
        "--block-size", str(block_size),
        "--num-kv-blocks", str(num_kv_blocks),
        "--max-num-batched-tokens", str(max_num_batched_tokens),
        "--max-model-len", str(max_model_len),
        "--seed", str(seed),
    ]  # fmt: skip
    load_average = os.getloadavg()[0]
    records: dict[str, list[RunRecord]] = {COLOCATED: [], DISAGG: []}
    with ServerGroup() as group, terminate_as_exit():
        progress.log("starting the servers")
        setups = start_setups(group, engine_args, cores)
        # Warm-up, a whole untimed round with prompts of its own: first calls allocate,
        # compile, and connect the producer to the consumer.
        for setup in setups:
            progress.log(f"warm-up {setup.name}")
            drive(setup.url, workload(999))
        for rep in range(repeats):
            w = workload(rep)
            for setup in setups:
                records[setup.name].append(timed_run(setup, w))
                f = run_figures(records[setup.name][-1])
                progress.log(
                    f"{setup.name} ({rep + 1}/{repeats}): window {f['window_s']:.2f} s, "
                    f"{f['tok_s']:,.0f} output tok/s"
                )
    figures = {name: setup_figures([run_figures(r) for r in rs]) for name, rs in records.items()}
    w = workload(0)
    return {
        "model": model,
        "workload": {
            "num_steady": num_steady,
            "steady_prompt_len": steady_prompt_len,
            "num_burst": num_burst,
            "burst_prompt_len": list(burst_prompt_len),
            "burst_output_len": burst_output_len,
            "burst_prompt_tokens": w.burst_prompt_tokens,
            # Over all rounds (each its own prompts), as the consumer's hits are counted.
            "loadable_tokens": sum(workload(i).loadable_tokens(block_size) for i in range(repeats)),
            "warm_tokens": warm_tokens,
        },
        "engine_args": engine_args,
        "cores": list(cores),
        "repeats": repeats,
        "cpu_count": os.cpu_count(),
        "load_average": {"start": load_average, "end": os.getloadavg()[0]},
        COLOCATED: figures[COLOCATED],
        DISAGG: figures[DISAGG],
        "ratios": ratios(figures[COLOCATED], figures[DISAGG]),
        "outputs_agree": all(
            outputs_agree(a, b) for a, b in zip(records[COLOCATED], records[DISAGG])
        ),
    }


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit while inside (in the main thread), so the server group's exit
    still stops every server; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def print_report(result: dict[str, Any], console: Console) -> None:
    w, co, dis, r = result["workload"], result[COLOCATED], result[DISAGG], result["ratios"]
    load = result["load_average"]
    console.print(
        f"[bold]nanovllm bench --disagg[/] on {result['model']}: {w['num_steady']} steady "
        f"streams (prompts of {w['steady_prompt_len']} tokens), then a burst of "
        f"{w['num_burst']} prompts of {w['burst_prompt_len'][0]}-{w['burst_prompt_len'][1]} "
        f"tokens ({w['burst_output_len']} output tokens each) once each stream has "
        f"{w['warm_tokens']}; greedy, EOS ignored; cores {result['cores']} of "
        f"{result['cpu_count']}, load average {load['start']:.1f} at start, {load['end']:.1f} at "
        f"end; {result['repeats']} interleaved rounds"
    )
    console.print(
        f"co-located: one server on cores {result['cores']}, 2 threads; disaggregated: producer "
        f"on core {result['cores'][0]}, consumer on core {result['cores'][1]}, 1 thread each, "
        f"P2pConnector over gloo on loopback, behind `nanovllm serve --disagg-proxy` (not pinned)"
    )

    rows = [
        ["steady ITL p50 before the burst, ms", _ms(co["itl_before_p50"]),
         _ms(dis["itl_before_p50"]), _ratio(r["itl_before_p50"])],
        ["steady ITL p50 during the burst, ms", _ms(co["itl_p50"]), _ms(dis["itl_p50"]),
         _ratio(r["itl_p50"])],
        ["steady ITL p99 during the burst, ms", _ms(co["itl_p99"]), _ms(dis["itl_p99"]),
         _ratio(r["itl_p99"])],
        ["steady ITL max during the burst, ms", _ms(co["itl_max"]), _ms(dis["itl_max"]),
         _ratio(r["itl_max"])],
        ["burst TTFT p50, ms", _ms(co["ttft_p50"]), _ms(dis["ttft_p50"]), _ratio(r["ttft_p50"])],
        ["burst TTFT p99, ms", _ms(co["ttft_p99"]), _ms(dis["ttft_p99"]), _ratio(r["ttft_p99"])],
        ["output tok/s in the burst, median (min-max)", _tok_s_range(co), _tok_s_range(dis), _ratio(r["tok_s"])],
        ["burst window s (sent to last token), median", f"{co['window_s']['median']:.2f}",
         f"{dis['window_s']['median']:.2f}", _ratio(r["window_s"])],
        ["steady gaps in the windows, all rounds", str(co["num_gaps"]), str(dis["num_gaps"]), ""],
    ]  # fmt: skip
    title = "A burst of long prompts beside steady decodes: co-located and disaggregated"
    _table(console, title, ["figure", COLOCATED, DISAGG, "disagg / co-located"], rows)
    console.print(
        f"the consumer loaded {dis['external_hits']:,} prompt tokens from the producer over the "
        f"{result['repeats']} rounds, of {w['loadable_tokens']:,} it could (every full prompt "
        "block but the one holding the prompt's last token, which it computes; a round's burst "
        f"prompts hold {w['burst_prompt_tokens']:,} tokens)"
    )
    if result["outputs_agree"]:
        console.print("greedy outputs agree between the setups in every round")
    else:
        console.print("[bold red]greedy outputs differ[/] between the setups (a bug)")
