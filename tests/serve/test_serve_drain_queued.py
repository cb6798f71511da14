"""At SIGTERM, a request that has not started is told at once, so its client retries elsewhere.

An engine with one seat (`max_num_seqs=1`) runs a long stream; a plain request and a streamed
one wait behind it. The server starts draining (what SIGTERM does: `Server.start_drain`).
Oracle, the README's promise: within a second the waiting plain request gets a 503
`server_shutting_down` and the waiting stream an error chunk of that code and `data: [DONE]`,
with no text; the running stream goes on to its end. Before the fix both waited out the
window (here the long stream's end, seconds later) and then ran.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from nanovllm import EngineConfig, LLMEngine
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread


@pytest.fixture
def one_seat_server(model_path):
    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=str(model_path), max_num_seqs=1)))
    try:
        with ServerThread(build_app(engine)) as running:
            running.engine = engine  # type: ignore[attr-defined]
            yield running
    finally:
        engine.shutdown()


def read_stream(url: str, max_tokens: int, lines: list[tuple[float, str]]) -> None:
    body = {"prompt": [5, 6, 7], "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append((time.monotonic(), line[len("data: ") :]))


def test_draining_ends_the_waiting_requests_at_once_and_the_running_one_goes_on(
    one_seat_server,
):
    url = one_seat_server.url
    running: list[tuple[float, str]] = []
    waiting: list[tuple[float, str]] = []
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=read_stream, args=(url, 400, running))]
    threads[0].start()
    deadline = time.monotonic() + 30
    while len(running) < 3:  # the long stream holds the one seat
        assert time.monotonic() < deadline
        time.sleep(0.01)
    threads.append(threading.Thread(target=read_stream, args=(url, 4, waiting)))
    body = {"prompt": [5, 6], "max_tokens": 4}
    threads.append(
        threading.Thread(
            target=lambda: answers.append(
                httpx.post(url + "/v1/completions", json=body, timeout=60)
            )
        )
    )
    for thread in threads[1:]:
        thread.start()
    engine = one_seat_server.engine
    while engine.stats.num_waiting < 2:  # both are queued behind the long stream
        assert time.monotonic() < deadline and engine.sync()
        time.sleep(0.01)
    assert not answers and not waiting, "a request behind the long stream ran: inconclusive"
    one_seat_server.server.start_drain("the test")
    drained = time.monotonic()
    health = httpx.get(url + "/health", timeout=10)  # the README's draining 503, headers too
    assert health.status_code == 503 and health.json()["error"]["code"] == "server_shutting_down"
    assert health.headers["retry-after"] == "1" and health.headers["connection"] == "close"
    for thread in threads[1:]:
        thread.join(30)
    assert answers[0].status_code == 503, answers[0].text
    assert answers[0].json()["error"]["code"] == "server_shutting_down"
    assert "had not started" in answers[0].json()["error"]["message"]
    assert [line for _, line in waiting][-1] == "[DONE]"
    error = json.loads(waiting[-2][1])["error"]
    assert error["code"] == "server_shutting_down" and len(waiting) == 2, waiting
    told = max(waiting[-1][0], drained)
    assert told - drained < 1.0, f"the waiting stream heard after {told - drained:.2f} s"
    # The running stream was not cut: it goes on past the drain to its own end.
    threads[0].join(60)
    assert running[-1][1] == "[DONE]" and running[-2][0] > drained, running[-3:]
    assert json.loads(running[-2][1])["choices"][-1]["finish_reason"] == "length", running[-3:]
