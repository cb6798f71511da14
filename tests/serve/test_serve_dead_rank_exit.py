"""A `nanovllm serve` process whose tensor-parallel rank died exits non-zero, for a supervisor.

A real 2-rank server process (gloo, on the CPU); its rank-1 worker is killed with SIGKILL while
a stream runs. Oracle, the README's promise: the stream in flight ends with an error chunk
(`engine_unavailable`) and `data: [DONE]`, and the process then exits with status 1 within
seconds, rather than serving 503s forever. (With `--keep-alive-on-engine-death` it serves the
503s: test_serve_tp_fault.py.)
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from serve_support import output, start_serve_process, stop_process

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
