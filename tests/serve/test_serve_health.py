"""`/health` sees a stuck engine: 503 while it has work and makes no step, 200 again after.

The stall is injected: the engine's `step` blocks on an event the test holds, with a request
waiting, and the server's bound is lowered to 1 s. Oracle: `/health`'s status before, during
and after, and the request's own answer once the engine steps again. Before the fix `/health`
answered 200 throughout (it asked only whether the engine thread was alive).
"""

from __future__ import annotations

import threading
import time

import httpx
from serve_support import wait_idle


def poll_health(url: str, status: int, timeout: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(url + "/health", timeout=5)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


def test_health_is_503_while_the_engine_is_stalled_and_200_after(server, async_engine, monkeypatch):
    wait_idle(async_engine)
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    release = threading.Event()
    engine = async_engine.engine
    step = engine.step

    def stalled_step():
        release.wait(30)
        return step()

    monkeypatch.setattr(async_engine, "stall_timeout_s", 1.0)
    monkeypatch.setattr(engine, "step", stalled_step)
    answers = []
    body = {"prompt": [5, 6, 7], "max_tokens": 3}
    sender = threading.Thread(
        target=lambda: answers.append(
            httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        )
    )
    sender.start()
    try:
        time.sleep(0.1)  # (a short stall is no stall)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        stalled = poll_health(server.url, 503)
        assert stalled.status_code == 503, stalled.text
        error = stalled.json()["error"]
        assert error["code"] == "engine_unavailable", error
        assert "has made no step" in error["message"] and "1 s" in error["message"], error
    finally:
        monkeypatch.setattr(engine, "step", step)
        release.set()
    sender.join(60)
    assert answers and answers[0].status_code == 200, answers
    assert poll_health(server.url, 200).status_code == 200
    wait_idle(async_engine)
    time.sleep(1.2)  # idle past the bound: an engine without work is not stalled
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
