"""A tensor-parallel rank that dies ends the engine: the server says so with 503s, not 500s.

A 2-rank engine (gloo, on the CPU) behind a real server; rank 1 is killed with SIGKILL while a
request runs. Oracle: the README's promise, `engine_unavailable` with status 503 from /health
and from every request, the one in flight included.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from nanovllm import EngineConfig, LLMEngine
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("while_running", [True, False], ids=["mid-request", "idle"])
def test_a_dead_rank_makes_health_and_requests_503(model_path, while_running):
    engine = AsyncLLMEngine(
        LLMEngine(EngineConfig(model=str(model_path), tensor_parallel_size=2, max_model_len=256))
    )
    try:
        with (
            ServerThread(build_app(engine)) as server,
            httpx.Client(base_url=server.url, timeout=120) as client,
        ):
            assert client.get("/health").status_code == 200
            body = {"prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True}
            responses: dict[str, httpx.Response] = {}
            runner = threading.Thread(
                target=lambda: responses.update(
                    {"in flight": client.post("/v1/completions", json=body)}
                )
            )
            if while_running:
                runner.start()
                deadline = time.monotonic() + 60
                while engine.stats.generation_tokens == 0:  # the request is under way
                    assert time.monotonic() < deadline and runner.is_alive()
                    time.sleep(0.01)
            os.kill(engine.engine.workers.pids[1], signal.SIGKILL)
            if while_running:
                runner.join(60)
                assert not runner.is_alive()
            else:  # nothing steps: the worker group's monitor is what sees the death
                deadline = time.monotonic() + 10
                while client.get("/health").status_code == 200:
                    assert time.monotonic() < deadline, "/health still says ok"
                    time.sleep(0.05)
            responses["health"] = client.get("/health")
            responses["completion"] = client.post("/v1/completions", json=body)
            responses["stream"] = client.post("/v1/completions", json={**body, "stream": True})
            for what, response in responses.items():
                assert response.status_code == 503, (what, response.text)
                error = response.json()["error"]
                assert error["code"] == "engine_unavailable", what
                assert error["type"] == "server_error", what
                assert "rank 1 died" in error["message"], (what, error)
    finally:
        engine.shutdown()
