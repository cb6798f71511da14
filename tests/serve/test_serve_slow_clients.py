"""Slow clients are timed out: a connection sending a byte at a time is closed.

Raw sockets against a real server (uvicorn on loopback) with a 1 s header timeout and a 1 s
body timeout: some send their request headers a byte every 0.1 s, some send whole headers and
then their body a byte every 0.1 s. Oracle: the server closes every one of them (a 408, then
end of stream) within a few seconds, while a normal request on another connection is served.
Before the fix each was held as long as it kept sending.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import httpx
import pytest

from nanovllm.serve.api_server import build_app
from nanovllm.serve.server import ServerThread

TIMEOUT_S = 1.0
GIVE_UP_S = 6.0  # a client still connected after this was never timed out


@pytest.fixture(scope="module")
def strict_server(async_engine):
    app = build_app(async_engine, body_timeout=TIMEOUT_S)
    with ServerThread(app, header_timeout=TIMEOUT_S) as running:
        yield running


def drip(port: int, head: bytes, body: bytes, result: dict) -> None:
    """Send `head` at once, then `body` a byte every 0.1 s (empty: send nothing more and wait);
    record when the server closed the connection, and what it said."""
    start = time.monotonic()
    received = b""
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head)
        while time.monotonic() - start < GIVE_UP_S:
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                try:
                    chunk = sock.recv(65536)
                except OSError:  # reset: the server closed with our bytes unread
                    break
                received += chunk
                if not chunk:
                    break
            if sent < len(body):
                try:
                    sock.sendall(body[sent : sent + 1])
                except OSError:  # closed by the server
                    break
                sent += 1
        sock.settimeout(1.0)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, OSError):
            pass
    result["closed_after"] = time.monotonic() - start
    result["received"] = received


def test_clients_sending_a_byte_at_a_time_are_closed(strict_server):
    port = strict_server.port
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    clients = []
    for i in range(3):  # the headers themselves, a byte at a time (a GET and a POST)
        clients.append((b"", request if i else b"GET /health HTTP/1.1\r\nHost: x\r\n" * 20))
    for _ in range(3):  # whole headers, then the body a byte at a time
        clients.append((request, b'{"prompt": "' + b"a" * 990))
    # Two that stop sending and wait: nothing of theirs is left unread, so the server's 408
    # arrives (a dripping client may see a reset instead, which loses it).
    stalled = [(b"GET /health HTTP/1.1\r\nHost:", b""), (request + b'{"pro', b"")]
    clients += stalled
    results: list[dict] = [{} for _ in clients]
    threads = [
        threading.Thread(target=drip, args=(port, head, body, result))
        for (head, body), result in zip(clients, results)
    ]
    for thread in threads:
        thread.start()
    # Meanwhile a client that sends its request at once is served.
    served = httpx.post(
        strict_server.url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}
    )
    assert served.status_code == 200, served.text
    for thread in threads:
        thread.join(GIVE_UP_S + 5)
    for i, result in enumerate(results):
        assert result["closed_after"] < TIMEOUT_S + 2.5, (i, result)
        said = result["received"]
        assert not said or said.startswith(b"HTTP/1.1 408 "), (i, said[:200])
    for result in results[-2:]:  # the stalled ones: the 408 arrived
        assert result["received"].startswith(b"HTTP/1.1 408 "), result
    body_timed_out = results[-1]["received"]
    assert b"request_timeout" in body_timed_out and b"--body-timeout" in body_timed_out
