"""`nanovllm serve --disagg-proxy`: one OpenAI endpoint in front of a prefill and a decode server.

Disaggregated prefill and decode (vLLM's `disagg_proxy` example) runs a prompt's prefill on one
engine (`kv_role: kv_producer`) and its decode on another (`kv_consumer`); a KV connector
carries the prompt's KV between them. This proxy is what a client talks to, exactly as it would
to one server:

    client --POST--> proxy --1. body, max_tokens=1, do_remote_decode--> PREFILL  (text discarded)
                           --2. body as sent,       do_remote_prefill--> DECODE  (streamed back)

Both upstream requests carry `kv_transfer_params` with one fresh `transfer_id`, so the decode
engine knows which transfer holds its prompt's KV, and its `signature` with the KV secret
(`kv_transfer/secret.py`: $NANOVLLM_KV_SECRET, else the file both engines read), without which
the servers refuse them. The decode server's status, Content-Type and
bytes go back to the client unchanged and as they arrive (SSE is never re-chunked).

When a part is missing, the client still gets its answer:

    prefill answers 4xx          that answer, unchanged: the request is the client's mistake
    prefill down, 5xx, timeout   decode without kv_transfer_params: it computes the prompt itself
    prefill fails its /health    prefill is skipped: decode computes the prompt at once
    decode unreachable           the original body to prefill, an ordinary request (a whole engine)
    both unreachable             502, naming both addresses
    decode breaks mid-stream     the client's response is cut as well (no final chunk), so it
                                 sees the break instead of waiting

A stopped or hung prefill server (SIGSTOP, a stuck step) answers nothing at all, so two bounds
keep it from holding requests: the wait for a prefill answer (`prefill_timeout_s`,
`--prefill-timeout`, 10 s by default), and a watcher that polls the prefill server's `/health`
every `health_check_interval_s` (`--health-check-interval`), each poll bounded by the interval
itself: while the last poll failed, requests skip prefill. So a prefill server that stops costs
a request at most the health-check interval plus the prefill timeout, and once the watcher has
seen it, nothing; when its `/health` answers 200 again, prefill is used again.

One state says whether prefill is used (`prefill_down`), and every poll writes it: the
watcher's, the proxy's own `/health` (so once it says 200, the next request goes through
prefill), and a request's, which polls at once rather than skip a prefill server never yet
seen up whose last poll was answered (refused: the proxy started before it). `/health` says
what the routing will do: `ok` (200) with both servers up, `degraded` (200) while one is out
and the proxy still answers through the other, `unavailable` (503) when it cannot answer.

A client that disconnects has its upstream requests closed at once, and nanovllm's server aborts
a request whose client has gone: no engine keeps generating for nobody. The proxy's door is
the server's own (`RequestGuard`: API key, body size, concurrency); the client's Authorization
header is passed on to both upstreams. `GET /prefill/{path}` and `GET /decode/{path}` reach
either engine's routes as they are (query string kept), so `nanovllm viz --connect
PROXY/prefill` watches the prefill engine's `/v1/events`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from nanovllm.kv_transfer.secret import kv_secret, transfer_signature
from nanovllm.serve.errors import error_body, error_type
from nanovllm.serve.guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    guarded_app,
)

logger = logging.getLogger("nanovllm.serve")

CONNECT_TIMEOUT_S = 10.0
PREFILL_TIMEOUT_S = 10.0  # the whole prefill request; past it, decode computes the prompt
HEALTH_TIMEOUT_S = 5.0
HEALTH_CHECK_INTERVAL_S = 2.0  # how often the prefill server's /health is polled
UNREACHABLE = "unreachable"  # how a /health probe that reached no server begins
NO_ANSWER = "no answer within"  # how one that reached a server that did not answer begins
# Fields the prefill request drops: they shape the output, which the proxy discards, and
# min_tokens > 1 would be refused next to max_tokens=1.
PREFILL_DROPPED = (
    "stream_options",
    "logprobs",
    "top_logprobs",
    "echo",
    "prompt_logprobs",
    "min_tokens",
)
# Upstream response headers a client may act on; hop-by-hop and length headers are uvicorn's.
PASSED_HEADERS = (
    "content-type",
    "cache-control",
    "retry-after",
    "www-authenticate",
    "x-accel-buffering",
)


def prefill_body(
    body: dict[str, Any], transfer_id: str, signature: str = "", deadline_ms: int | None = None
) -> dict[str, Any]:
    """The prefill engine's request: the prompt, one token, no stream, KV to be sent away (by
    `deadline_ms`, when given: past it, the server refuses the request)."""
    prefill = {k: v for k, v in body.items() if k not in PREFILL_DROPPED}
    prefill["max_tokens"] = 1
    if "max_completion_tokens" in body:  # chat: OpenAI's newer name wins over max_tokens
        prefill["max_completion_tokens"] = 1
    prefill["stream"] = False
    prefill["n"] = 1
    prefill["kv_transfer_params"] = {
        "do_remote_decode": True,
        "transfer_id": transfer_id,
        "signature": signature,
    }
    if deadline_ms is not None:
        prefill["kv_transfer_params"]["deadline_ms"] = deadline_ms
    return prefill


def decode_body(
    body: dict[str, Any], transfer_id: str | None, signature: str = ""
) -> dict[str, Any]:
    """The decode engine's request: the client's own, told where its prompt's KV comes from
    (`transfer_id` None: the prefill failed, so no KV is coming and decode computes it)."""
    if transfer_id is None:
        return body
    params = {"do_remote_prefill": True, "transfer_id": transfer_id, "signature": signature}
    return {**body, "kv_transfer_params": params}


def _passed_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() in PASSED_HEADERS}


def _upstream_headers(request: Request) -> dict[str, str]:
    """What goes upstream from the client's headers: its key. `identity`: the bytes relayed
    are the bytes the client reads, so nothing needs decoding on the way."""
    headers = {"accept-encoding": "identity"}
    if "authorization" in request.headers:
        headers["authorization"] = request.headers["authorization"]
    return headers


def _refuses_transfer(answer: httpx.Response) -> bool:
    """Whether a server refused the `kv_transfer_params` the proxy added (its clock ahead of
    the proxy's by more than the prefill timeout, say, or another KV secret)."""
    if answer.status_code != 403:
        return False
    try:
        return answer.json()["error"]["code"] == "kv_transfer_params_forbidden"
    except (ValueError, KeyError, TypeError):
        return False


def _error(status: int, message: str, code: str) -> JSONResponse:
    """OpenAI's error shape, errors.py's types: `invalid_request_error` below 500."""
    return JSONResponse(error_body(message, error_type(status), None, code), status_code=status)


class UpstreamResponse(StreamingResponse):
    """An open upstream response relayed as it arrives; the upstream request is closed however
    this response ends (finished, upstream broken, or the client gone).

    Starlette cancels the relay when the client disconnects (it listens for `http.disconnect`
    beside it); closing the upstream response then closes its connection, which is how the
    engine behind it learns its client has gone.
    """

    def __init__(self, upstream: httpx.Response, name: str) -> None:
        super().__init__(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            headers=_passed_headers(upstream),
        )
        self.upstream = upstream
        self.name = name

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError as exc:
            # No final chunk: uvicorn closes the connection, and the client sees the break.
            logger.warning("the %s server broke off its response: %r", self.name, exc)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()


async def _until_disconnect(request: Request, work: Awaitable[Response]) -> Response | None:
    """`work`'s response, or None when the client disconnects first (then `work` is cancelled,
    and an upstream response it had opened is closed). Nothing is sent to a client waiting for a
    non-streamed answer, so only watching `receive` notices that it left."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # let the cancellation close what it opened
    if task.cancelled():
        return None
    response = task.result()
    if watcher.done() and not watcher.cancelled() and isinstance(response, UpstreamResponse):
        await response.upstream.aclose()  # opened just as the client left
        return None
    return response


class DisaggProxy:
    """The routes' work: one `httpx.AsyncClient` (opened by the app's lifespan) and the two
    upstream base URLs."""

    def __init__(
        self,
        prefill_url: str,
        decode_url: str,
        prefill_timeout_s: float,
        health_check_interval_s: float = HEALTH_CHECK_INTERVAL_S,
    ) -> None:
        self.prefill_url = prefill_url.rstrip("/")
        self.decode_url = decode_url.rstrip("/")
        self.prefill_timeout_s = prefill_timeout_s
        self.health_check_interval_s = health_check_interval_s
        self.client: httpx.AsyncClient | None = None
        self.kv_secret = kv_secret()  # signs each transfer id: only the proxy may name one
        # The last word on the prefill server (the watcher's, a request's or /health's poll):
        # None while it answers /health with a 200, else why not. Requests skip prefill while
        # it is set, and /health reports it: one state for both.
        self.prefill_down: str | None = None  # (until the first poll says otherwise: used)
        self.prefill_seen_up = False  # has its /health ever answered 200?
        self._poll: asyncio.Future | None = None  # the poll in flight, shared by its callers
        self._watcher: asyncio.Task | None = None

    async def watch_prefill(self) -> None:
        """Poll the prefill server's /health for as long as the proxy runs (its own task)."""
        interval = self.health_check_interval_s
        while True:
            started = asyncio.get_running_loop().time()
            await self.check_prefill()
            elapsed = asyncio.get_running_loop().time() - started
            await asyncio.sleep(max(interval - elapsed, 0.0))

    async def check_prefill(self) -> str | None:
        """Ask the prefill server's /health now and record the answer in `prefill_down` (None:
        up), which the routing reads. Callers at the same moment share one poll; a caller that
        is cancelled (a client gone) does not cancel it for the others."""
        if self._poll is None or self._poll.done():
            self._poll = asyncio.ensure_future(self._poll_prefill())
        return await asyncio.shield(self._poll)

    async def _poll_prefill(self) -> str | None:
        status = await self._probe(self.prefill_url, self.health_check_interval_s)
        down = None if status == "ok" else status
        if down != self.prefill_down:
            if down is None:
                logger.warning("prefill at %s is healthy: prefill is used", self.prefill_url)
            elif self.prefill_seen_up:
                logger.warning(
                    "prefill at %s is down (/health: %s): decode computes prompts until it is back",
                    self.prefill_url,
                    down,
                )
        self.prefill_down = down
        self.prefill_seen_up |= down is None
        return down

    async def _probe(self, base_url: str, timeout: float) -> str:
        """One GET of `base_url`/health: "ok" for a 200, else what it answered, in words."""
        assert self.client is not None
        try:
            answer = await self.client.get(base_url + "/health", timeout=timeout)
        except httpx.TimeoutException:
            return f"{NO_ANSWER} {timeout:g} s"
        except httpx.TransportError as exc:
            return f"{UNREACHABLE}: {exc!r}"
        return "ok" if answer.status_code == 200 else f"HTTP {answer.status_code}"

    def open(self) -> None:
        self.client = httpx.AsyncClient(
            # Streams may idle for long (a slow step, a quiet event stream): no read timeout.
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            # No pool limit: each client request holds its upstream connections, and the
            # guard's --max-concurrent-requests is the bound.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    def start_watching(self) -> None:
        self._watcher = asyncio.ensure_future(self.watch_prefill())

    async def close(self) -> None:
        for task in (self._watcher, self._poll):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.client is not None:
            await self.client.aclose()

    async def generate(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"the request body is not valid JSON: {exc}", "json_invalid")
        if not isinstance(body, dict):
            kind = type(body).__name__
            return _error(
                400, f"the request body must be a JSON object, got {kind}", "invalid_body"
            )
        headers = _upstream_headers(request)
        response = await _until_disconnect(request, self._prefill_then_decode(path, body, headers))
        if response is None:
            return _error(499, "client disconnected", "client_disconnected")
        return response

    async def _prefill_then_decode(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> Response:
        assert self.client is not None
        transfer_id: str | None = uuid.uuid4().hex
        signature = transfer_signature(self.kv_secret, transfer_id)
        # The prefill request carries the moment the proxy gives up on it, signed: a prefill
        # server that reads it later (it was stopped, and resumed) refuses it uncomputed.
        deadline_ms = int((time.time() + self.prefill_timeout_s) * 1000)
        prefill_signature = transfer_signature(self.kv_secret, transfer_id, deadline_ms)
        down = self.prefill_down
        if down is not None and not self.prefill_seen_up and not down.startswith(NO_ANSWER):
            # Never seen up, and its last poll was answered at once (the proxy started before
            # it, say: refused): ask again now rather than skip it until the next poll. (One
            # that does not answer at all would cost each request the wait: it is skipped.)
            down = await self.check_prefill()
        if down is not None:
            failure: Response | str | None = f"skipped: {down}"
        else:
            prefill = prefill_body(body, transfer_id, prefill_signature, deadline_ms)
            failure = await self._prefill(path, prefill, headers)
        if isinstance(failure, Response):
            return failure  # the client's own mistake, as the prefill server worded it
        if failure is not None:
            logger.warning(
                "prefill at %s failed (%s): decode computes the prompt itself",
                self.prefill_url,
                failure,
            )
            transfer_id = None
        decode = decode_body(body, transfer_id, signature)
        decode_error = await self._open("decode", self.decode_url + path, decode, headers)
        if isinstance(decode_error, Response):
            return decode_error
        logger.warning(
            "decode at %s unreachable (%s): the prefill server runs the whole request",
            self.decode_url,
            decode_error,
        )
        prefill_error = await self._open("prefill", self.prefill_url + path, body, headers)
        if isinstance(prefill_error, Response):
            return prefill_error
        return _error(
            502,
            f"neither upstream answered: decode {self.decode_url} ({decode_error}), "
            f"prefill {self.prefill_url} ({prefill_error})",
            "upstream_unavailable",
        )

    async def _prefill(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> Response | str | None:
        """None when the prefill ran; a Response to give the client when it refused the request
        (4xx); else why it failed, in words."""
        assert self.client is not None
        try:
            answer = await asyncio.wait_for(
                self.client.post(self.prefill_url + path, json=body, headers=headers),
                self.prefill_timeout_s,
            )
        except asyncio.TimeoutError:
            return f"no answer within {self.prefill_timeout_s:g} s"
        except httpx.TransportError as exc:
            return repr(exc)
        if answer.is_success:
            return None
        if _refuses_transfer(answer):  # ours to mend, never the client's: decode computes it
            return f"HTTP {answer.status_code}: {answer.text[:200]}"
        if 400 <= answer.status_code < 500:
            return Response(answer.content, answer.status_code, headers=_passed_headers(answer))
        return f"HTTP {answer.status_code}: {answer.text[:200]}"

    async def _open(
        self, name: str, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> UpstreamResponse | str:
        """The upstream response, open and about to be relayed; or, when no response came (the
        request may not have reached the server, or its connection broke before an answer), why.
        """
        assert self.client is not None
        upstream = self.client.build_request("POST", url, json=body, headers=headers)
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.TransportError as exc:
            return repr(exc)
        return UpstreamResponse(answer, name)

    async def relay_get(self, request: Request, name: str, path: str) -> Response:
        """GET `path?query` on the `name`d upstream, relayed as it arrives (an endless event
        stream too)."""
        assert self.client is not None
        base_url = self.prefill_url if name == "prefill" else self.decode_url
        url = httpx.URL(base_url).copy_with(
            path="/" + path.lstrip("/"), query=request.url.query.encode()
        )
        upstream = self.client.build_request("GET", url, headers=_upstream_headers(request))
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.TransportError as exc:
            return _error(502, f"{name} {base_url} did not answer: {exc!r}", "upstream_unavailable")
        return UpstreamResponse(answer, name)

    async def health(self) -> JSONResponse:
        """What the routing will do, from a fresh poll of both upstreams: 200 `ok` when both
        answer /health with a 200; 200 `degraded` while one is out but the proxy still answers
        through the other (prefill down: decode computes prompts; decode unreachable: prefill
        runs whole requests); 503 `unavailable` when it cannot answer. The prefill poll is the
        routing's own (`check_prefill`), so a 200 here means the next request uses prefill."""
        prefill, decode = await asyncio.gather(
            self.check_prefill(), self._probe(self.decode_url, HEALTH_TIMEOUT_S)
        )
        prefill = prefill or "ok"
        report = {
            "prefill": {"url": self.prefill_url, "status": prefill},
            "decode": {"url": self.decode_url, "status": decode},
        }
        # A decode server that answers is relayed whatever it says; one that cannot be reached
        # is replaced by the prefill server (`_prefill_then_decode`).
        answers = decode == "ok" or (decode.startswith(UNREACHABLE) and prefill == "ok")
        status = "ok" if prefill == decode == "ok" else "degraded" if answers else "unavailable"
        return JSONResponse({"status": status, **report}, status_code=200 if answers else 503)


def _unauthorized() -> JSONResponse:
    response = _error(
        401,
        "Incorrect API key provided: send it as 'Authorization: Bearer <key>'",
        "invalid_api_key",
    )
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


def build_proxy_app(
    prefill_url: str,
    decode_url: str,
    *,
    api_key: str | None = None,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    max_concurrent_requests: int | None = DEFAULT_MAX_CONCURRENT_REQUESTS,
    prefill_timeout_s: float = PREFILL_TIMEOUT_S,
    health_check_interval_s: float = HEALTH_CHECK_INTERVAL_S,
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
) -> FastAPI:
    """The proxy's app, in front of two running `nanovllm serve` base URLs (http://HOST:PORT).
    `api_key`, `max_request_body_bytes`, `max_concurrent_requests` and `body_timeout` are the
    guard's; `prefill_timeout_s` bounds the wait for a prefill answer, and the prefill server's
    /health is polled every `health_check_interval_s` (module docstring)."""
    for name, value in (
        ("prefill_timeout_s", prefill_timeout_s),
        ("health_check_interval_s", health_check_interval_s),
    ):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    for name, url in (("prefill", prefill_url), ("decode", decode_url)):
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"the {name} address must be http://HOST:PORT, got {url!r}")
    proxy = DisaggProxy(prefill_url, decode_url, prefill_timeout_s, health_check_interval_s)
    expected = f"Bearer {api_key}".encode() if api_key else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        proxy.open()
        proxy.start_watching()
        try:
            yield
        finally:
            await proxy.close()

    app = guarded_app(
        "nanovllm disaggregated prefill/decode proxy",
        f"prefill: {proxy.prefill_url}, decode: {proxy.decode_url}",
        lifespan,
        api_key=api_key,
        max_request_body_bytes=max_request_body_bytes,
        max_concurrent_requests=max_concurrent_requests,
        body_timeout=body_timeout,
    )
    app.state.proxy = proxy

    def authorized(request: Request) -> bool:
        """The guard checks /v1/*; the engines' own routes behind /prefill and /decode (their
        event streams show every prompt) need the key as well."""
        if expected is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = f"Bearer {token}" if scheme.lower() == "bearer" else f"{scheme} {token}"
        return hmac.compare_digest(given.encode(), expected)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy.generate(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.generate(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        return await proxy.relay_get(request, "decode", "/v1/models")

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> Response:
        return await proxy.relay_get(request, "decode", f"/v1/models/{model_id}")

    @app.get("/health")
    async def health() -> JSONResponse:
        if app.state.server_state.draining:
            return _error(503, "the proxy is shutting down", "server_shutting_down")
        return await proxy.health()

    @app.get("/prefill/{path:path}")
    async def prefill_get(path: str, request: Request) -> Response:
        if not authorized(request):
            return _unauthorized()
        return await proxy.relay_get(request, "prefill", path)

    @app.get("/decode/{path:path}")
    async def decode_get(path: str, request: Request) -> Response:
        if not authorized(request):
            return _unauthorized()
        return await proxy.relay_get(request, "decode", path)

    return app
