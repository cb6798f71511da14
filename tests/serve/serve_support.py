"""Constants and helpers shared by the server tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from nanovllm import EngineConfig, LLMEngine, SamplingParams
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread

# A template that works with any tokenizer (no special tokens of its own).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# 16 distinct prompts of 3-7 token ids (ids < 256 exist in every test tokenizer).
PROMPTS = [[(7 * i + j) % 200 + 3 for j in range(3 + i % 5)] for i in range(16)]
MAX_TOKENS = 24


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def strip_chat_template(path: Path) -> None:
    """Whatever tokenizer the tiny model got, make sure it has no chat template."""
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        if config.pop("chat_template", None) is not None:
            config_file.write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)


def wait_idle(engine: AsyncLLMEngine, timeout: float = 30.0) -> None:
    """Until the engine has nothing running or waiting and every KV block is free."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert engine.sync(timeout), "the engine thread did not answer"
        stats = engine.stats  # fresh: published after everything sent before sync()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.num_used_blocks == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine not idle after {timeout} s: {engine.stats}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve_process(
    model: Path, *flags: str, timeout: float = 180.0
) -> tuple[subprocess.Popen, str]:
    """`nanovllm serve MODEL FLAGS` as a child process on a free loopback port; returns once its
    /health answers 200. The caller ends it (`stop_process`)."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")  # not a pipe: a full pipe would block the server
    process = subprocess.Popen(
        [sys.executable, "-m", "nanovllm", "serve", str(model), "--port", str(port), *flags],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    process.log = log  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}: {output(process)}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop_process(process)
            raise AssertionError(f"the server did not start: {output(process)}")
        time.sleep(0.2)


def output(process: subprocess.Popen) -> str:
    """What the child has printed so far (the last 3,000 characters)."""
    log = process.log  # type: ignore[attr-defined]
    log.seek(0)
    return log.read()[-3000:]


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(30)


NUM_STREAMS = 4


def worst_gap_while(server, send) -> tuple[float, object]:
    """The longest gap between consecutive chunks of any of NUM_STREAMS running streams while
    `send(client)` runs (from each stream's last chunk before it), and what `send` returned."""
    arrivals: list[list[float]] = [[] for _ in range(NUM_STREAMS)]
    ended: list[bool] = [False] * NUM_STREAMS

    def stream(i: int) -> None:
        body = {"prompt": [5, 6, 7 + i], "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        arrivals[i].append(time.monotonic())
                        ended[i] = line == "data: [DONE]"

    runners = [threading.Thread(target=stream, args=(i,)) for i in range(NUM_STREAMS)]
    for runner in runners:
        runner.start()
    deadline = time.monotonic() + 30
    while min(len(a) for a in arrivals) < 10:  # every stream is under way
        assert time.monotonic() < deadline and all(r.is_alive() for r in runners)
        time.sleep(0.005)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        start = time.monotonic()
        result = send(client)
        end = time.monotonic()
    for runner in runners:
        runner.join(60)
    assert all(ended), "a stream did not end with [DONE]"
    worst = 0.0
    for times in arrivals:
        times = [t for t in times if t >= max(t for t in times if t < start)]
        worst = max(worst, *(b - a for a, b in zip(times, times[1:])))
        if times[-1] < end:  # the stream ended first: its gaps do not cover the request
            worst = max(worst, end - times[-1])
    return worst, result


def allowed_gap(server, bound: float = 0.5) -> float:
    """The bound on a stream's gap: `bound`, or twice the control's gap (the same streams
    while a small request is answered) on a loaded machine."""
    control, _ = worst_gap_while(
        server, lambda client: client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2})
    )
    return max(bound, 2 * control)


@contextmanager
def running_engine(model_path: Path) -> Iterator[AsyncLLMEngine]:
    """An engine on the checkpoint at `model_path`, shut down on leaving (conftest.py's session
    engine, and a module's own where a test must not share one)."""
    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=str(model_path))))
    try:
        yield engine
    finally:
        engine.shutdown()


@contextmanager
def serving(engine: AsyncLLMEngine, chat_template: str | None = None) -> Iterator[ServerThread]:
    """A real server on loopback for `engine` (with `chat_template`, as --chat-template gives)."""
    with ServerThread(build_app(engine, chat_template=chat_template)) as running:
        yield running
