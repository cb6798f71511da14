"""A `nanovllm serve` process whose tensor-parallel rank died exits non-zero, for a supervisor.

A real 2-rank server process (gloo, on the CPU); its rank-1 worker is killed with SIGKILL while
a stream runs. Oracle, the README's promise: the stream in flight ends with an error chunk
(`engine_unavailable`) and `data: [DONE]`, and the process then exits with status 1 within
seconds, rather than serving 503s forever. (With `--keep-alive-on-engine-death` it serves the
503s: test_serve_tp_fault.py.)

The window the last answers get starts once the engine thread has failed them, not when the
death is first seen: `test_the_answers_window_starts_when_the_engine_has_failed_them` drives the
server's tick with a clock of its own (this test failed once in CI, the stream cut short, when
the window started at the monitor's sighting).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from serve_support import output, start_serve_process, stop_process

from nanovllm.serve import server as server_module
from nanovllm.serve.guard import ServerState

pytestmark = pytest.mark.slow


def worker_pids(pid: int) -> list[int]:
    """The children of `pid` that are multiprocessing's spawned workers (the ranks > 0)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    workers = []
    for child in children:
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
            workers.append(child)
    return workers


def test_a_dead_rank_makes_the_server_exit_non_zero_after_answering(model_path):
    process, url = start_serve_process(
        model_path,
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "256",
        "--log-level",
        "warning",
    )
    try:
        workers = worker_pids(process.pid)
        assert len(workers) == 1, workers
        body = {"prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True, "stream": True}
        lines = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(line[len("data: ") :])
                if len(lines) == 3:  # under way
                    os.kill(workers[0], signal.SIGKILL)
                    killed = time.monotonic()
        assert lines[-1] == "[DONE]", lines[-3:]
        error = json.loads(lines[-2])["error"]
        assert error["code"] == "engine_unavailable" and "rank 1 died" in error["message"]
        assert process.wait(30) == 1, output(process)
        assert time.monotonic() - killed < 20
        assert "the engine died" in output(process)
    finally:
        stop_process(process)


class DyingEngine:
    """An engine whose rank died: dead at once, its thread still failing the requests."""

    def __init__(self) -> None:
        self.stopped = False

    def dead_reason(self) -> str:
        return "the engine has stopped: tensor-parallel rank 1 died: killed by signal SIGKILL"

    def has_stopped(self) -> bool:
        return self.stopped


def test_the_answers_window_starts_when_the_engine_has_failed_them(monkeypatch) -> None:
    app = FastAPI()
    app.state.server_state, app.state.engine = ServerState(), DyingEngine()
    app.state.server_state.in_flight = 1  # a stream still waiting for its error
    server = server_module.Server(uvicorn.Config(app))
    clock = [100.0]
    monkeypatch.setattr(server_module.time, "monotonic", lambda: clock[0])

    def tick_at(t: float) -> bool:
        clock[0] = t
        return asyncio.run(server.on_tick(1))

    assert not tick_at(100.0)  # seen: new requests refused, the stream still served
    assert server.state.draining and server.engine_dead is not None
    assert not tick_at(100.0 + server_module.FLUSH_S + 1)  # the thread has not failed it yet
    app.state.engine.stopped = True
    assert not tick_at(105.0)  # failed now: its error gets FLUSH_S to go out
    assert not tick_at(105.0 + server_module.FLUSH_S - 0.1)
    assert tick_at(105.0 + server_module.FLUSH_S)
    # A thread that never stops does not keep the process alive: STOP_WAIT_S, then the window.
    server = server_module.Server(uvicorn.Config(app))
    app.state.engine.stopped = False
    assert not tick_at(200.0)
    assert not tick_at(200.0 + server_module.STOP_WAIT_S)
    assert tick_at(200.0 + server_module.STOP_WAIT_S + server_module.FLUSH_S)
    # With nothing in flight there is nothing to wait for.
    server = server_module.Server(uvicorn.Config(app))
    app.state.server_state.in_flight = 0
    assert tick_at(300.0)
