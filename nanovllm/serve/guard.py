"""The server's door: who may come in, how big a request may be, and how many at once.

A plain ASGI middleware in front of every route, so nothing it refuses reaches a handler (or
the engine). In the order it checks:

    1. API key    with `--api-key` (or $NANOVLLM_API_KEY), every /v1/* route and /events need
                  `Authorization: Bearer <key>`, else 401. The key is compared with
                  `hmac.compare_digest`, whose time does not depend on where the strings first
                  differ, so a client cannot find the key a character at a time by timing.
                  /health, /metrics and the docs stay open (a load balancer or Prometheus
                  polls them; they show no prompts).
    2. body size  a request body over `max_request_body_bytes` is a 413: refused by its
                  Content-Length before any of it is read, or, for a chunked body, as soon as
                  the bytes read pass the limit. Bodies under it are buffered here and replayed
                  to the handler. The whole body must arrive within `body_timeout` seconds
                  (`--body-timeout`), else a 408 and the connection is closed: a client sending
                  a byte a second holds no connection for long. (The headers' bound is the
                  server's: server.py.)
    2b. JSON      a generation request's body must say it is JSON (Content-Type), be UTF-8
                  without NUL bytes and nest at most 128 deep, else a 400 that says
                  which (body.py), before FastAPI's parser sees it. With `max_model_len`
                  (the server's, not the proxy's), a large body's prompt of more token ids
                  than that is a 400 before the request models validate it (body.py).
    0. draining   once the server is shutting down (SIGTERM: server.py), every generation
                  request and event stream is a 503 `server_shutting_down` with
                  `Connection: close`, so a load balancer sends it elsewhere.
    3. in flight  at most `max_concurrent_requests` generation requests (/v1/completions,
                  /v1/chat/completions) at once, counted from arrival until the response has
                  been sent in full (a stream: until its last chunk); one more is a 429 with
                  `Retry-After: 1`, at once rather than queued, so a client learns the server is
                  full instead of waiting without a bound. (Requests the engine has accepted
                  wait in its own queue for a batch slot: that queue is what this bounds.)

Errors are OpenAI's shape (errors.py), with the types and codes OpenAI uses for 401 and 429.
This file imports only the standard library (it writes its few responses as raw ASGI
messages), so `nanovllm serve --help` can read its defaults without loading the web stack.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from nanovllm.serve.body import BodyError, check_items, check_json_body

if TYPE_CHECKING:
    from fastapi import FastAPI

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_REQUEST_BODY_BYTES = 2 * 2**20  # 2 MiB: a 128k-token prompt as text or as ids fits
DEFAULT_MAX_CONCURRENT_REQUESTS = 1024
DEFAULT_BODY_TIMEOUT_S = 60.0  # nginx's client_body_timeout; 2 MiB in it needs 35 KB/s
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
EVENT_PATHS = frozenset({"/v1/events", "/events"})
# vLLM's tokenizer routes: they take a JSON body (checked as a generation request's is) and,
# with an API key, the key (they run the server's tokenizer and chat template for the caller).
TOKENIZER_PATHS = frozenset({"/tokenize", "/detokenize"})


class ServerState:
    """What the guard, `/health` and the server's own loop (server.py) share: whether the server
    is draining, and how many generation requests are in flight (their responses not yet sent
    in full). Only the event loop thread changes it."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0


def needs_api_key(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path == "/events" or path in TOKENIZER_PATHS


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None = None,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
        max_concurrent_requests: int | None = DEFAULT_MAX_CONCURRENT_REQUESTS,
        state: ServerState | None = None,
        body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
        max_model_len: int | None = None,
    ) -> None:
        if body_timeout <= 0:
            raise ValueError(f"body_timeout must be > 0, got {body_timeout}")
        if max_request_body_bytes < 1:
            raise ValueError(f"max_request_body_bytes must be >= 1, got {max_request_body_bytes}")
        if max_concurrent_requests is not None and max_concurrent_requests < 1:
            raise ValueError(
                f"max_concurrent_requests must be >= 1 (or None: no limit), "
                f"got {max_concurrent_requests}"
            )
        self.app = app
        self._expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_request_body_bytes = max_request_body_bytes
        self.max_concurrent_requests = max_concurrent_requests
        self.state = state if state is not None else ServerState()
        self.body_timeout = body_timeout
        self.max_model_len = max_model_len

    @property
    def in_flight(self) -> int:
        return self.state.in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self.state.draining and (path in GENERATION_PATHS or path in EVENT_PATHS):
            await _error(
                send,
                503,
                "the server is shutting down: send the request to another server",
                "server_error",
                "server_shutting_down",
                {"Connection": "close", "Retry-After": "1"},
            )
            return
        if self._expected is not None and needs_api_key(path) and not self._authorized(scope):
            await _error(
                send,
                401,
                "Incorrect API key provided: send it as 'Authorization: Bearer <key>'",
                "invalid_request_error",
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_request_body_bytes:
            await self._too_large(send)
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body = await asyncio.wait_for(self._read_body(receive), self.body_timeout)
            except asyncio.TimeoutError:
                await _error(
                    send,
                    408,
                    f"the request body did not arrive within {self.body_timeout:g} s "
                    "(--body-timeout)",
                    "invalid_request_error",
                    "request_timeout",
                    {"Connection": "close"},  # the rest of the body is not read
                )
                return
            if body is None:
                await self._too_large(send)
                return
            receive = _replay(body, receive)
            if body and (path in GENERATION_PATHS or path in TOKENIZER_PATHS):
                try:
                    check_json_body(_header(scope, b"content-type"), body)
                    if self.max_model_len is not None:
                        check_items(body, self.max_model_len)
                except BodyError as exc:
                    await _error(
                        send,
                        exc.status,
                        exc.message,
                        "invalid_request_error",
                        exc.code,
                        param=exc.param,
                    )
                    return
        limit = self.max_concurrent_requests
        counted = path in GENERATION_PATHS
        if counted and limit is not None and self.in_flight >= limit:
            await _error(
                send,
                429,
                f"the server is at its limit of {limit} concurrent requests "
                "(--max-concurrent-requests): retry later",
                "requests",
                "rate_limit_exceeded",
                {"Retry-After": "1"},
            )
            return
        if counted:
            self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            if counted:
                self.state.in_flight -= 1

    def _authorized(self, scope: Scope) -> bool:
        assert self._expected is not None
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        given = b"Bearer " + token if scheme.lower() == b"bearer" else given
        return hmac.compare_digest(given, self._expected)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the limit."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to replay
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, send: Send) -> None:
        await _error(
            send,
            413,
            f"the request body is larger than the server's limit of "
            f"{self.max_request_body_bytes} bytes (--max-request-body-bytes)",
            "invalid_request_error",
            "request_too_large",
            {"Connection": "close"},  # the rest of the body is not read
        )


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the buffered body first, then whatever the client sends next
    (a disconnect: the handlers watch for it)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _error(
    send: Send,
    status: int,
    message: str,
    type: str,
    code: str,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> None:
    """An OpenAI-shaped JSON error, written as the two ASGI messages of a response."""
    body = json.dumps(
        {"error": {"message": message, "type": type, "param": param, "code": code}}
    ).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def guarded_app(
    title: str,
    description: str,
    lifespan: Any,
    *,
    api_key: str | None,
    max_request_body_bytes: int,
    max_concurrent_requests: int,
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
    max_model_len: int | None = None,
) -> FastAPI:
    """A FastAPI app with OpenAI-shaped errors and `RequestGuard` in front of every route: what
    the server (`api_server.py`) and the disaggregated proxy (`disagg_proxy.py`) start from.
    `app.state.server_state` is the guard's `ServerState` (server.py drains through it)."""
    from fastapi import FastAPI  # (here: `nanovllm serve --help` reads this module's defaults)

    from nanovllm import __version__
    from nanovllm.serve.errors import install_error_handlers

    app = FastAPI(title=title, version=__version__, description=description, lifespan=lifespan)
    install_error_handlers(app)
    app.state.server_state = ServerState()
    app.add_middleware(
        RequestGuard,
        api_key=api_key,
        max_request_body_bytes=max_request_body_bytes,
        max_concurrent_requests=max_concurrent_requests,
        state=app.state.server_state,
        body_timeout=body_timeout,
        max_model_len=max_model_len,
    )
    return app
