"""Constants and helpers shared by the server tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from nanovllm import SamplingParams
from nanovllm.serve.async_engine import AsyncLLMEngine

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
