"""The llama.cpp engines and build script without llama.cpp: the server's command line and
requests, its event stream, the whole server plug-in against a fake server, and the build's
CMake options. None of them needs a build of llama.cpp.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import types
from pathlib import Path

import pytest

from nanovllm.bench import engine_llamacpp as lc
from nanovllm.bench.engines import EngineLimits, EngineUnavailable, make_engine
from nanovllm.bench.workload import BenchRequest, random_workload, with_poisson_arrivals


def test_server_command_follows_the_limits_and_the_workload() -> None:
    limits = EngineLimits(max_num_seqs=32, max_num_batched_tokens=512, threads=2)
    limits.num_kv_blocks = 100  # nanovllm's own capacity plays no part: see below
    # One KV stream per slot, as long as the workload's longest request (llama.cpp splits
    # --ctx-size among the slots): not one unified cache, whose every token attends over every
    # sequence's cells, nor max_model_len per slot.
    settings = lc.server_settings(limits, num_seqs=40, seq_len=256)
    assert settings == {"threads": 2, "parallel": 32, "ctx_size": 32 * 256, "batch_size": 512}
    assert lc.server_settings(limits, num_seqs=5, seq_len=100)["ctx_size"] == 5 * 100
    command = lc.server_command(Path("/b/llama-server"), Path("/m.gguf"), 8080, settings)
    flags = {flag: value for flag, value in zip(command, command[1:]) if flag.startswith("--")}
    assert command[0] == "/b/llama-server" and flags["--model"] == "/m.gguf"
    assert (flags["--threads"], flags["--threads-batch"], flags["--parallel"]) == ("2", "2", "32")
    assert (flags["--ctx-size"], flags["--batch-size"], flags["--port"]) == ("8192", "512", "8080")
    assert {"--cont-batching", "--no-webui"} <= set(command) and "--kv-unified" not in command


def test_completion_request_is_the_bench_request() -> None:
    request = BenchRequest([5, 6, 7], max_tokens=9, seed=3)
    greedy = lc.completion_request(request, 0.0)
    assert greedy["prompt"] == [5, 6, 7] and greedy["n_predict"] == 9
    assert greedy["ignore_eos"] and greedy["stream"] and not greedy["cache_prompt"]
    assert (greedy["samplers"], greedy["top_k"]) == (["top_k"], 1)
    sampled = lc.completion_request(request, 0.7)
    assert sampled["samplers"] == ["temperature"]
    assert (sampled["temperature"], sampled["seed"]) == (0.7, 3)


def test_a_stream_error_or_a_cut_stream_is_reported() -> None:
    with pytest.raises(EngineUnavailable, match="context size"):
        lc.parse_event(b'error: {"message": "context size exceeded"}\n')
    with pytest.raises(EngineUnavailable, match="overloaded"):
        lc.parse_event(b'data: {"error": "overloaded"}\n')
    with pytest.raises(EngineUnavailable, match="ended before its last event .2 tokens"):
        lc.stream_tokens(iter([b'data: {"tokens": [1, 2], "stop": false}\n']), lambda: 0.0)


# A stand-in for llama-server: /health, and /completion streaming token ids that follow from the
# prompt (the k-th is (sum of the prompt + k) % 1000), one event per token, one token past
# n_predict as the real server may send when a token ends mid-character.
FAKE_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["ignore_eos"] and body["stream"] and body["top_k"] == 1, body
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for k in range(1, body["n_predict"] + 2):
            event = {"tokens": [(sum(body["prompt"]) + k) % 1000], "stop": False}
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\\n\\n")
            self.wfile.flush()
        final = {"tokens": [], "stop": True, "timings": {"predicted_n": body["n_predict"]}}
        self.wfile.write(b"data: " + json.dumps(final).encode() + b"\\n\\n")

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _fake_llamacpp(tmp_path: Path, monkeypatch) -> Path:
    """FAKE_SERVER as `llama-server` in the bench's llama.cpp folder; a GGUF file's path."""
    server = tmp_path / "llama-server"
    server.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_SERVER))
    server.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("LLAMACPP_BIN_DIR", str(tmp_path))
    return model


def test_the_plugin_against_a_fake_server(tmp_path, monkeypatch) -> None:
    model = _fake_llamacpp(tmp_path, monkeypatch)
    engine = make_engine("llamacpp", str(model), EngineLimits(threads=2))
    try:
        info = engine.load()
        workload = with_poisson_arrivals(random_workload(5, (3, 6), (1, 5), 1000), rate=500.0)
        run = engine.run(workload)
        command = " ".join(engine.command)
        first = engine.proc
        again = engine.run(workload)  # the same shape: the same server
        assert engine.proc is first and again.records[0].token_ids == run.records[0].token_ids
    finally:
        engine.close()
    assert "2 threads" in info["configuration"] and "--parallel 5" in command
    assert f"--ctx-size {5 * workload.max_seq_len}" in command
    assert run.engine == "llamacpp" and run.wall_s > 0
    for r, rec in zip(workload.requests, run.records):
        expected = [(sum(r.prompt_token_ids) + k) % 1000 for k in range(1, r.max_tokens + 1)]
        assert rec.token_ids == expected and len(rec.token_times) == r.max_tokens
        assert rec.arrival_s == r.arrival_s <= rec.token_times[0] <= run.wall_s


# A bench that starts the (fake) server, prints its pid, and waits to be killed.
BENCH_KILLED_MIDWAY = """
import sys, time
from nanovllm.bench.engines import EngineLimits, make_engine
from nanovllm.bench.workload import random_workload

engine = make_engine("llamacpp", sys.argv[1], EngineLimits(threads=2))
engine.load()
engine.serve_workload(random_workload(2, (3, 6), (1, 5), 1000))
print(engine.proc.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_a_killed_bench_takes_its_server_with_it(tmp_path, monkeypatch) -> None:
    """SIGKILL gives the bench no chance to close its engines: the server must still go."""
    model = _fake_llamacpp(tmp_path, monkeypatch)
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH_KILLED_MIDWAY, str(model)], stdout=subprocess.PIPE, text=True
    )
    pid = int(bench.stdout.readline())
    try:
        assert _running(pid)
        bench.kill()
        bench.wait()
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), "llama-server outlived the bench that started it"
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_exits() -> None:
    """The race `die_with_parent` closes: the parent died before the child asked for a signal."""
    code = "from nanovllm.bench.child_lifetime import die_with_parent\n"
    code += "die_with_parent(parent_pid=-1)\nprint('still running')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    expected = (1, "") if sys.platform.startswith("linux") else (0, "still running\n")
    assert (done.returncode, done.stdout) == expected


def test_it_is_skipped_with_its_reason(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LLAMACPP_BIN_DIR", str(tmp_path))
    with pytest.raises(EngineUnavailable, match="GGUF files only"):
        make_engine("llamacpp", str(tmp_path), EngineLimits()).load()
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(EngineUnavailable, match=f"no {tmp_path}/llama-server; build it"):
        make_engine("llamacpp", str(model), EngineLimits()).load()


def test_the_build_script_builds_the_vendored_llamacpp_for_this_cpu(tmp_path, monkeypatch) -> None:
    from nanovllm.bench.tools import build_llamacpp as build

    source = tmp_path / "src" / "llama_cpp_python-9.9" / "vendor" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("project(x)\n")
    sdist = tmp_path / "llama_cpp_python-9.9.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "src" / "llama_cpp_python-9.9", "llama_cpp_python-9.9")
    assert build.vendored_llamacpp(sdist, tmp_path / "out") == (
        tmp_path / "out" / "llama_cpp_python-9.9" / "vendor" / "llama.cpp"
    )
    configure = build.cmake_configure_command(source, tmp_path / "b")
    assert {"-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF", "-DCMAKE_BUILD_TYPE=Release"} <= set(
        configure
    )
    command = build.cmake_build_command(tmp_path / "b", 2)
    targets = {command[i + 1] for i, flag in enumerate(command) if flag == "--target"}
    assert (
        targets == {"llama-server", "llama-batched-bench"}
        and command[command.index("-j") + 1] == "2"
    )

    ran: list[list[str]] = []  # the whole script, with the commands recorded, not run
    monkeypatch.setattr(build.subprocess, "run", lambda command, check: ran.append(command))
    build.main(["--build-dir", str(tmp_path / "out"), "--sdist", str(sdist),
                "--target", "llama-batched-bench"])  # fmt: skip
    configured, built = ran
    unpacked = (tmp_path / "out").resolve() / "llama_cpp_python-9.9" / "vendor" / "llama.cpp"
    assert configured[configured.index("-S") + 1] == str(unpacked)
    assert [built[i + 1] for i, flag in enumerate(built) if flag == "--target"] == [
        "llama-batched-bench"
    ]

    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz") as tar:
        tar.add(sdist, "llama_cpp_python-0/README")
    with pytest.raises(FileNotFoundError, match="no vendor/llama.cpp"):
        build.vendored_llamacpp(empty, tmp_path / "out2")


def test_no_amx_turns_on_this_cpus_extensions_and_amx_off() -> None:
    from nanovllm.bench.tools.build_llamacpp import without_amx

    options = without_amx({"fma", "avx2", "avx512f", "amx_tile", "amx_int8", "sse"})
    assert {"-DGGML_FMA=ON", "-DGGML_AVX2=ON", "-DGGML_AVX512=ON"} <= set(options)
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF"} <= set(options)
    assert not any(o.endswith("=ON") and "AMX" in o for o in options)
    assert "-DGGML_AVX512_VNNI=ON" not in options  # not in the flags given


class FakeLlama:
    """llama.cpp's C API as `llamacpp-batched` calls it: a KV cache of one stream per sequence
    (llama.cpp's default) that checks each sequence's positions arrive in order and fit its
    stream, and logits whose argmax is (token + position) % vocab."""

    vocab = 50

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.next_pos: dict[int, int] = {}
        self.out = None
        self.contexts: list[types.SimpleNamespace] = []  # the params of each context made
        self.max_seqs = self.stream_len = 0

    def llama_context_default_params(self):
        return types.SimpleNamespace(kv_unified=False)

    def llama_init_from_model(self, model, params):
        assert model == "model" and params.n_batch == self.batch_size
        self.contexts.append(params)
        self.max_seqs, self.stream_len = params.n_seq_max, params.n_ctx // params.n_seq_max
        self.next_pos.clear()
        return f"ctx{len(self.contexts)}"

    def llama_free(self, ctx):
        assert ctx == f"ctx{len(self.contexts)}"  # only the context held is freed

    def batch(self):
        n = self.batch_size
        return types.SimpleNamespace(
            token=[0] * n, pos=[0] * n, logits=[0] * n, n_seq_id=[0] * n,
            seq_id=[[0] for _ in range(n)], n_tokens=0,
        )  # fmt: skip

    def llama_get_memory(self, ctx):
        return "memory"

    def llama_memory_clear(self, memory, data):
        self.next_pos.clear()

    def llama_memory_seq_rm(self, memory, seq, p0, p1):
        del self.next_pos[seq]

    def llama_decode(self, ctx, b):
        assert 0 < b.n_tokens <= self.batch_size
        rows = []
        for n in range(b.n_tokens):
            seq, pos = b.seq_id[n][0], b.pos[n]
            assert b.n_seq_id[n] == 1 and 0 <= seq < self.max_seqs
            assert pos == self.next_pos.get(seq, 0), (seq, pos)  # no gap, no repeat
            assert pos < self.stream_len, (seq, pos)  # the sequence fits its own stream
            self.next_pos[seq] = pos + 1
            if b.logits[n]:
                rows.append((b.token[n] + pos) % self.vocab)
        self.out = (ctypes.c_float * (len(rows) * self.vocab))()
        for r, best in enumerate(rows):
            self.out[r * self.vocab + best] = 1.0
        return 0

    def llama_get_logits(self, ctx):
        return ctypes.cast(self.out, ctypes.POINTER(ctypes.c_float))


def test_the_batched_engine_schedules_every_request_through_the_c_api() -> None:
    from nanovllm.bench.engine_llamacpp_batched import BatchedLoop

    engine = BatchedLoop("unused.gguf", EngineLimits())
    fake = engine.L = FakeLlama(batch_size=16)  # prompts chunked, requests queued
    engine.model, engine.batch, engine.n_vocab = "model", fake.batch(), fake.vocab
    engine.settings = {"batch_size": 16, "parallel": 3, "threads": 2}
    workload = random_workload(7, (3, 20), (1, 6), fake.vocab)
    for w in (workload.head(2, 0.5), workload, workload):  # a later run starts from an empty cache
        run = engine.run(w)
        # one KV stream per sequence (a unified one makes each token attend over all of them)
        params = fake.contexts[-1]
        assert not params.kv_unified and params.n_seq_max == min(3, w.num_requests)
        assert params.n_threads == params.n_threads_batch == 2
        for r, rec in zip(w.requests, run.records):
            token, pos, expected = r.prompt_token_ids[-1], r.num_prompt_tokens - 1, []
            for _ in range(r.max_tokens):
                token = (token + pos) % fake.vocab
                expected.append(token)
                pos += 1
            assert rec.token_ids == expected and len(rec.token_times) == r.max_tokens
        assert fake.next_pos == {}  # every finished sequence's cells were freed
    assert len(fake.contexts) == 2  # grown once for the larger workload, then reused


class EchoLoop:
    """A stand-in for `BatchedLoop` in the child: a run's tokens are its prompts' lengths."""

    def __init__(self, model_path: str, limits: EngineLimits) -> None:
        self.model_path, self.limits = model_path, limits

    def load(self) -> dict:
        return {"model": self.model_path, "threads": self.limits.threads}

    def run(self, workload):
        from nanovllm.bench.records import EngineRun, RequestRecord

        if not workload.greedy:
            raise EngineUnavailable("greedy only")
        records = [RequestRecord([r.num_prompt_tokens], [0.5]) for r in workload.requests]
        return EngineRun("llamacpp-batched", 1.0, records)

    def close(self) -> None:
        pass


def test_the_batched_child_serves_json_lines(monkeypatch) -> None:
    from nanovllm.bench import engine_llamacpp_batched as eb
    from nanovllm.bench.records import EngineRun

    monkeypatch.setattr(eb, "BatchedLoop", EchoLoop)
    workload = random_workload(3, (2, 9), (1, 1), 100)
    lines = [
        {"cmd": "load", "model": "m.gguf", "limits": {"threads": 2}},
        {"cmd": "run", "workload": workload.to_dict()},
        {"cmd": "run", "workload": {**workload.to_dict(), "temperature": 1.0}},
        {"cmd": "quit"},
        {"cmd": "run", "workload": workload.to_dict()},  # (after quit: not read)
    ]
    replies = io.StringIO()
    eb.serve([json.dumps(c) + "\n" for c in lines], replies)
    load, run, refused = (json.loads(r) for r in replies.getvalue().splitlines())
    assert load == {"ok": True, "info": {"model": "m.gguf", "threads": 2}}
    tokens = [r.token_ids for r in EngineRun.from_dict(run["run"]).records]
    assert tokens == [[r.num_prompt_tokens] for r in workload.requests]
    assert refused == {"ok": False, "error": "greedy only"}


def test_the_batched_engine_reports_its_childs_refusal(tmp_path) -> None:
    # (a real child process; it refuses before it would load libllama)
    engine = make_engine("llamacpp-batched", str(tmp_path / "model.bin"), EngineLimits())
    try:
        with pytest.raises(EngineUnavailable, match="GGUF files only; the model is .*model.bin"):
            engine.load()
    finally:
        engine.close()
    assert engine.proc is None
