"""The disaggregated prefill/decode proxy (`nanovllm serve --disagg-proxy`, disagg_proxy.py).

Most tests put the proxy in front of two fake upstreams: small FastAPI apps that record every
request they receive (path, body, Authorization) and answer as told, so what the proxy sends
each engine, and what it gives back, is checked exactly and without a model. One test puts it
in front of two real servers (two engines on the tiny model) and checks, through the `openai`
client, that the answers are those of one server asked directly.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.cli import main
from nanovllm.kv_transfer.secret import check_transfer_params, kv_secret, transfer_signature
from nanovllm.serve.disagg_proxy import PREFILL_DROPPED, build_proxy_app, decode_body, prefill_body
from nanovllm.serve.errors import error_body
from nanovllm.serve.server import ServerThread
from nanovllm.serve.sse import ClosingStreamingResponse

WAIT_S = 5.0  # the longest any test waits for something that should happen at once


def wait_for(condition, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


# --- the fake upstream ----------------------------------------------------------------------


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    authorization: str | None


@dataclass
class Fake:
    """One fake `nanovllm serve`. `mode` says how it answers a generation request:

    json      the answer at once (`status` other than 200: an error of that status)
    slow      waits `delay_s` (or for its client to leave) first
    wait      never answers: waits for its client to leave
    sse       a stream of `chunks` events then [DONE]; the last waits for `release`
    forever   an endless stream, until its client leaves
    break     two events, then the connection breaks (no end of the chunked body)
    """

    name: str
    mode: str = "json"
    status: int = 200
    health_status: int = 200
    delay_s: float = 0.0
    chunks: int = 5
    received: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    gone: threading.Event = field(default_factory=threading.Event)  # a client left mid-request

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """As new (the servers live for the module; each test starts from this)."""
        self.mode, self.status, self.health_status, self.delay_s, self.chunks = (
            "json",
            200,
            200,
            0,
            5,
        )
        self.received.clear()
        self.release.set()
        self.gone.clear()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"server": self.name, "object": "text_completion", "prompt": body.get("prompt")}

    def events(self, body: dict[str, Any]) -> list[bytes]:
        """The SSE messages of a stream, as bytes (several to a chunk: the proxy must relay the
        bytes as they come, not re-frame them)."""
        tag = json.dumps(body.get("prompt"))
        return [
            f'data: {{"server":"{self.name}","i":{i},"prompt":{tag}}}\n\n'.encode()
            for i in range(self.chunks)
        ] + [b"data: [DONE]\n\n"]

    def app(self) -> FastAPI:
        app = FastAPI()

        async def until_gone(request: Request) -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.gone.set()

        async def generate(request: Request) -> Response:
            body = await request.json()
            self.received.append(
                Received(request.url.path, body, request.headers.get("authorization"))
            )
            if self.mode == "slow":
                try:
                    await asyncio.wait_for(until_gone(request), self.delay_s)
                    return Response(status_code=499)
                except asyncio.TimeoutError:
                    pass
            if self.mode == "wait":
                await until_gone(request)
                return Response(status_code=499)
            if self.status != 200:
                message = f"{self.name} says {self.status}"
                headers = {"Retry-After": "7"} if self.status == 429 else None
                return JSONResponse(
                    error_body(message, "invalid_request_error", "prompt", "invalid_value"),
                    status_code=self.status,
                    headers=headers,
                )
            if not body.get("stream") and self.mode in ("json", "slow"):
                return JSONResponse(self.answer(body))
            return stream(body)

        def stream(body: dict[str, Any]) -> Response:
            done = threading.Event()

            async def sse() -> AsyncIterator[bytes]:
                events = self.events(body)
                if self.mode == "forever":
                    while True:
                        yield events[0]
                        await asyncio.sleep(0.01)
                if self.mode == "break":
                    yield events[0] + events[1]
                    await asyncio.sleep(0.05)
                    raise RuntimeError("the fake breaks its stream")
                yield b"".join(events[:2])  # two messages in one chunk
                for event in events[2:-1]:
                    await asyncio.sleep(0.002)
                    yield event
                while not self.release.is_set():
                    await asyncio.sleep(0.005)
                yield events[-1]
                done.set()

            def on_close() -> None:
                if not done.is_set():
                    self.gone.set()

            return ClosingStreamingResponse(sse(), on_close=on_close)

        app.add_api_route("/v1/completions", generate, methods=["POST"])
        app.add_api_route("/v1/chat/completions", generate, methods=["POST"])

        @app.get("/health")
        async def health() -> Response:
            return JSONResponse({"status": "ok"}, status_code=self.health_status)

        @app.get("/v1/models")
        async def models(request: Request) -> Response:
            auth = request.headers.get("authorization")
            return JSONResponse({"object": "list", "data": [{"id": self.name, "auth": auth}]})

        @app.get("/v1/events")
        async def events(request: Request) -> Response:
            query = request.url.query

            async def sse() -> AsyncIterator[bytes]:
                while True:
                    yield f'data: {{"server":"{self.name}","query":"{query}"}}\n\n'.encode()
                    await asyncio.sleep(0.01)

            return ClosingStreamingResponse(sse(), on_close=self.gone.set)

        return app


def closed_url() -> str:
    """An address where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, tuple[Fake, ServerThread]]]:
    """The two fake upstreams and a proxy in front of them, started once for the module."""
    prefill, decode = Fake("prefill"), Fake("decode")
    with ServerThread(prefill.app()) as p, ServerThread(decode.app()) as d:
        with ServerThread(build_proxy_app(p.url, d.url)) as proxy:
            yield {"prefill": (prefill, p), "decode": (decode, d), "proxy": (None, proxy)}


@pytest.fixture
def prefill(fakes) -> tuple[Fake, ServerThread]:
    fakes["prefill"][0].reset()
    return fakes["prefill"]


@pytest.fixture
def decode(fakes) -> tuple[Fake, ServerThread]:
    fakes["decode"][0].reset()
    return fakes["decode"]


@pytest.fixture
def proxy(fakes, prefill, decode) -> ServerThread:
    """The module's proxy, its routing fresh: its /health polls prefill now, so a prefill that
    an earlier test made answer 503 is used again at once (the watcher's next poll may be
    seconds away, and a request sent before it would skip prefill)."""
    server = fakes["proxy"][1]
    assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    return server


def proxy_of(prefill_url: str, decode_url: str, **kwargs: Any) -> ServerThread:
    return ServerThread(build_proxy_app(prefill_url, decode_url, **kwargs))


BODY = {"model": "m", "prompt": "hello", "max_tokens": 20, "temperature": 0}


def assert_prefill_params(params: dict[str, Any], transfer_id: str, timeout_s: float = 10) -> None:
    """A prefill request's kv_transfer_params: its transfer, and the moment the proxy gives up
    on it (within `timeout_s`, the prefill timeout, from now), both signed; the servers' own
    check accepts them now and refuses them once that moment has passed."""
    deadline_ms = params["deadline_ms"]
    assert 0 < deadline_ms - time.time() * 1000 <= timeout_s * 1000
    signature = transfer_signature(kv_secret(), transfer_id, deadline_ms)
    assert params == {
        "do_remote_decode": True,
        "transfer_id": transfer_id,
        "signature": signature,
        "deadline_ms": deadline_ms,
    }
    assert check_transfer_params(kv_secret(), params) is None
    assert "deadline_ms passed 1 ms ago" in check_transfer_params(
        kv_secret(), params, now_ms=deadline_ms + 1
    )
    assert "signature" in check_transfer_params(kv_secret(), {**params, "deadline_ms": 2**62})


# --- what each engine is sent ---------------------------------------------------------------


def test_prefill_gets_one_token_and_decode_the_body_both_with_one_transfer_id(
    prefill, decode, proxy
):
    body = {
        **BODY,
        "n": 2,
        "logprobs": 2,
        "echo": True,
        "min_tokens": 3,
        "prompt_logprobs": 1,
        "stream_options": {"include_usage": True},
        "stop": ["\n"],
        "seed": 5,
    }
    answer = httpx.post(proxy.url + "/v1/completions", json=body, headers={"Authorization": "k"})
    assert answer.status_code == 200
    assert answer.json() == decode[0].answer(body)
    [sent_prefill], [sent_decode] = prefill[0].received, decode[0].received
    transfer_id = sent_prefill.body["kv_transfer_params"]["transfer_id"]
    assert len(transfer_id) == 32 and int(transfer_id, 16) >= 0  # uuid4().hex
    # Signed with the KV secret, which the servers check: only the proxy names a transfer.
    signed = {"transfer_id": transfer_id, "signature": transfer_signature(kv_secret(), transfer_id)}
    assert_prefill_params(sent_prefill.body["kv_transfer_params"], transfer_id)
    assert sent_prefill.body == {
        "model": "m",
        "prompt": "hello",
        "max_tokens": 1,
        "temperature": 0,
        "n": 1,
        "stop": ["\n"],
        "seed": 5,
        "stream": False,
        "kv_transfer_params": sent_prefill.body["kv_transfer_params"],
    }
    assert sent_decode.body == {**body, "kv_transfer_params": {"do_remote_prefill": True, **signed}}
    assert sent_prefill.path == sent_decode.path == "/v1/completions"
    assert sent_prefill.authorization == sent_decode.authorization == "k"
    # A second request: a fresh transfer id.
    httpx.post(proxy.url + "/v1/completions", json=BODY)
    again = prefill[0].received[1].body["kv_transfer_params"]["transfer_id"]
    assert again != transfer_id
    assert decode[0].received[1].body["kv_transfer_params"]["transfer_id"] == again


@pytest.mark.parametrize(
    "limits, expected",
    [
        ({"max_completion_tokens": 30}, {"max_completion_tokens": 1, "max_tokens": 1}),
        ({"max_tokens": 30}, {"max_tokens": 1}),
        ({}, {"max_tokens": 1}),
    ],
)
def test_chat_prefill_is_limited_to_one_token_whichever_limit_is_sent(
    prefill, decode, proxy, limits, expected
):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "top_logprobs": 2,
        "stream": True,
        **limits,
    }
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200
        answer.read()
    sent_prefill = prefill[0].received[0]
    assert sent_prefill.path == "/v1/chat/completions"
    transfer_id = sent_prefill.body["kv_transfer_params"]["transfer_id"]
    signed = {"transfer_id": transfer_id, "signature": transfer_signature(kv_secret(), transfer_id)}
    assert_prefill_params(sent_prefill.body["kv_transfer_params"], transfer_id)
    assert sent_prefill.body == {
        "messages": body["messages"],
        "stream": False,
        "n": 1,
        **expected,
        "kv_transfer_params": sent_prefill.body["kv_transfer_params"],
    }
    assert decode[0].received[0].body == {
        **body,
        "kv_transfer_params": {"do_remote_prefill": True, **signed},
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
field_names = st.sampled_from(
    [*PREFILL_DROPPED, "max_tokens", "max_completion_tokens", "n", "stream", "prompt", "x"]
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(field_names | st.text(max_size=8), json_values), st.uuids())
def test_the_rewrites_change_only_what_they_must(body, uuid):
    original = json.loads(json.dumps(body))
    tid = uuid.hex
    prefill = prefill_body(body, tid, "sig")
    kept = {k: v for k, v in body.items() if k not in PREFILL_DROPPED}
    fixed = {"max_tokens": 1, "stream": False, "n": 1}
    fixed["kv_transfer_params"] = {"do_remote_decode": True, "transfer_id": tid, "signature": "sig"}
    if "max_completion_tokens" in body:
        fixed["max_completion_tokens"] = 1
    assert prefill == {**kept, **fixed}
    assert decode_body(body, tid, "sig") == {
        **body,
        "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": tid, "signature": "sig"},
    }
    assert decode_body(body, None) == body
    assert body == original  # the client's body is never changed in place


# --- errors and failures --------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 404, 429])
def test_a_prefill_4xx_goes_back_unchanged_and_decode_is_not_asked(prefill, decode, proxy, status):
    prefill[0].status = status
    direct = httpx.post(prefill[1].url + "/v1/completions", json=BODY)
    prefill[0].received.clear()
    answer = httpx.post(proxy.url + "/v1/completions", json=BODY)
    assert answer.status_code == status
    assert answer.content == direct.content
    assert answer.headers.get("retry-after") == direct.headers.get("retry-after")
    assert len(prefill[0].received) == 1
    assert decode[0].received == []


@pytest.mark.parametrize("failure", ["5xx", "down", "timeout"])
def test_a_failed_prefill_leaves_decode_to_compute_the_prompt(prefill, decode, failure):
    prefill_url = prefill[1].url
    if failure == "5xx":
        prefill[0].status = 503
    elif failure == "down":
        prefill_url = closed_url()
    else:
        prefill[0].mode, prefill[0].delay_s = "slow", 30.0
    with proxy_of(prefill_url, decode[1].url, prefill_timeout_s=0.5) as proxy:
        started = time.monotonic()
        answer = httpx.post(proxy.url + "/v1/completions", json=BODY, timeout=10)
        elapsed = time.monotonic() - started
    assert answer.status_code == 200
    assert answer.json() == decode[0].answer(BODY)
    assert [r.body for r in decode[0].received] == [BODY]  # no kv_transfer_params
    if failure == "timeout":
        assert 0.5 <= elapsed < 5
        wait_for(prefill[0].gone.is_set, "the timed-out prefill request to be closed")


def test_a_hung_prefill_costs_at_most_the_health_interval_plus_the_timeout(decode):
    """A stopped prefill process (SIGSTOP) still completes TCP handshakes (the kernel does) and
    then answers nothing: a socket that listens and never accepts is the same. The watcher's
    failed /health makes later requests skip prefill entirely."""
    interval, timeout = 0.3, 1.0
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        hung_url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        with proxy_of(
            hung_url, decode[1].url, prefill_timeout_s=timeout, health_check_interval_s=interval
        ) as proxy:
            costs = []
            for _ in range(3):
                started = time.monotonic()
                answer = httpx.post(proxy.url + "/v1/completions", json=BODY, timeout=10)
                costs.append(time.monotonic() - started)
                assert answer.status_code == 200 and answer.json() == decode[0].answer(BODY)
            assert max(costs) < interval + timeout + 0.5, costs
            assert costs[-1] < 0.5, f"prefill was not skipped once /health failed: {costs}"
            assert all(r.body == BODY for r in decode[0].received)  # no kv_transfer_params
            health = httpx.get(proxy.url + "/health", timeout=10).json()
            assert health["prefill"]["status"] != "ok"


def test_prefill_work_the_proxy_gave_up_on_is_refused_when_read_late(prefill, decode):
    """A stopped prefill server (SIGSTOP: the kernel accepts the connection and keeps its
    bytes) resumes after the proxy gave up on it, and reads the request then. The servers'
    own check, which runs before a request reaches the engine (`check_transfer_params`),
    refuses it: its signed deadline has passed. (Before, the request carried no deadline, and
    the resumed engine computed a prefill nobody would use.) A prefill server that refuses the
    proxy's kv_transfer_params (its clock ahead, say) costs the client nothing: decode answers."""
    prefill[0].mode = "wait"  # answers nothing, as a stopped server
    with proxy_of(prefill[1].url, decode[1].url, prefill_timeout_s=0.5) as proxy:
        answer = httpx.post(proxy.url + "/v1/completions", json=BODY, timeout=10)
    assert answer.status_code == 200 and answer.json() == decode[0].answer(BODY)
    [late] = prefill[0].received
    assert "deadline_ms passed" in check_transfer_params(
        kv_secret(), late.body["kv_transfer_params"]
    )

    refusing = FastAPI()

    @refusing.post("/v1/completions")
    async def refuse() -> Response:
        message = "kv_transfer_params' deadline_ms passed 7 ms ago"
        body = error_body(
            message, "invalid_request_error", "kv_transfer_params", "kv_transfer_params_forbidden"
        )
        return JSONResponse(body, status_code=403)

    decode[0].received.clear()
    with ServerThread(refusing) as refuser, proxy_of(refuser.url, decode[1].url) as proxy:
        answer = httpx.post(proxy.url + "/v1/completions", json=BODY, timeout=10)
    assert answer.status_code == 200 and answer.json() == decode[0].answer(BODY)
    assert [r.body for r in decode[0].received] == [BODY]  # computed there, no transfer named


def test_prefill_resumes_when_its_health_answers_again(prefill, decode):
    with proxy_of(prefill[1].url, decode[1].url, health_check_interval_s=0.1) as proxy:
        app = proxy.server.config.app
        prefill[0].health_status = 503
        wait_for(lambda: app.state.proxy.prefill_down is not None, "prefill marked down")
        httpx.post(proxy.url + "/v1/completions", json=BODY)
        assert prefill[0].received == [] and [r.body for r in decode[0].received] == [BODY]
        prefill[0].health_status = 200
        wait_for(lambda: app.state.proxy.prefill_down is None, "prefill marked up")
        httpx.post(proxy.url + "/v1/completions", json=BODY)
        assert len(prefill[0].received) == 1
        assert decode[0].received[-1].body["kv_transfer_params"]["do_remote_prefill"] is True


def test_the_default_prefill_timeout_is_short():
    import argparse

    from nanovllm.serve.cli import add_arguments, proxy_options

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = ["--disagg-proxy", "--prefill", "http://a:1", "--decode", "http://b:2"]
    options = proxy_options(parser.parse_args(flags))
    assert options["prefill_timeout_s"] <= 10 and options["health_check_interval_s"] <= 2
    options = proxy_options(parser.parse_args([*flags, "--prefill-timeout", "3"]))
    assert options["prefill_timeout_s"] == 3


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreachable_decode_leaves_the_whole_request_to_prefill(prefill, stream):
    body = {**BODY, "stream": stream}
    direct = httpx.post(prefill[1].url + "/v1/completions", json=body)
    prefill[0].received.clear()
    with proxy_of(prefill[1].url, closed_url()) as proxy:
        answer = httpx.post(proxy.url + "/v1/completions", json=body)
    assert answer.status_code == 200
    assert answer.content == direct.content
    assert answer.headers["content-type"] == direct.headers["content-type"]
    first, second = (r.body for r in prefill[0].received)
    assert first["kv_transfer_params"]["do_remote_decode"] is True  # the prefill step first
    assert second == body  # then the client's own request, as an ordinary one


def test_both_unreachable_is_a_502_naming_both():
    prefill_url, decode_url = closed_url(), closed_url()
    with proxy_of(prefill_url, decode_url) as proxy:
        answer = httpx.post(proxy.url + "/v1/completions", json=BODY)
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert prefill_url in error["message"] and decode_url in error["message"]
    assert (error["type"], error["code"]) == ("server_error", "upstream_unavailable")


@pytest.mark.parametrize(
    "content, code",
    [(b'{"prompt": "x",', "json_invalid"), (b'["a list"]', "invalid_body")],
)
def test_a_body_that_is_not_a_json_object_is_a_400_and_reaches_no_engine(
    prefill, decode, proxy, content, code
):
    answer = httpx.post(
        proxy.url + "/v1/completions",
        content=content,
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == code
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    assert prefill[0].received == decode[0].received == []


# --- streams ----------------------------------------------------------------------------------


def test_a_stream_is_relayed_byte_for_byte_as_it_arrives(prefill, decode, proxy):
    body = {**BODY, "stream": True}
    direct = httpx.post(decode[1].url + "/v1/completions", json=body)
    decode[0].release.clear()  # the last event waits: the proxy must not wait for it
    expected = decode[0].events(body)
    got = b""
    with httpx.stream("POST", proxy.url + "/v1/completions", json=body, timeout=WAIT_S) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"] == direct.headers["content-type"]
        chunks = answer.iter_raw()
        while len(got) < len(b"".join(expected[:-1])):
            got += next(chunks)
        assert got == b"".join(expected[:-1])  # everything but the held-back last event
        decode[0].release.set()
        got += b"".join(chunks)
    assert got == direct.content == b"".join(expected)


def test_a_decode_that_breaks_mid_stream_ends_the_clients_stream(prefill, decode, proxy):
    decode[0].mode = "break"
    body = {**BODY, "stream": True}
    got = b""
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", proxy.url + "/v1/completions", json=body, timeout=WAIT_S) as r:
            for chunk in r.iter_raw():
                got += chunk
    assert time.monotonic() - started < WAIT_S
    assert got == b"".join(decode[0].events(body)[:2])


def test_a_client_leaving_a_stream_closes_the_decode_request(prefill, decode, proxy):
    decode[0].mode = "forever"
    with httpx.stream("POST", proxy.url + "/v1/completions", json={**BODY, "stream": True}) as r:
        assert next(r.iter_raw()).startswith(b'data: {"server":"decode"')
    wait_for(decode[0].gone.is_set, "the decode server to see its client leave")


@pytest.mark.parametrize("waiting_on", ["prefill", "decode"])
def test_a_client_leaving_a_non_streamed_request_closes_the_upstream_one(
    prefill, decode, proxy, waiting_on
):
    fake = prefill[0] if waiting_on == "prefill" else decode[0]
    fake.mode = "wait"

    async def leave() -> None:
        async with httpx.AsyncClient() as client:
            task = asyncio.create_task(client.post(proxy.url + "/v1/completions", json=BODY))
            deadline = time.monotonic() + WAIT_S
            while not fake.received:
                assert time.monotonic() < deadline, f"the {waiting_on} server got no request"
                await asyncio.sleep(0.005)
            task.cancel()  # closes the connection
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(leave())
    wait_for(fake.gone.is_set, f"the {waiting_on} server to see its client leave")
    if waiting_on == "prefill":
        assert decode[0].received == []


# --- the other routes -----------------------------------------------------------------------


def test_the_api_key_is_checked_and_passed_on(prefill, decode):
    with proxy_of(prefill[1].url, decode[1].url, api_key="sk-proxy") as proxy:
        for path in ("/v1/completions", "/v1/chat/completions"):
            refused = httpx.post(proxy.url + path, json=BODY)
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["code"] == "invalid_api_key"
        for path in ("/v1/models", "/prefill/v1/events", "/decode/v1/events"):
            wrong = httpx.get(proxy.url + path, headers={"Authorization": "Bearer sk-wrong"})
            assert wrong.status_code == 401, path
            assert wrong.json()["error"]["code"] == "invalid_api_key"
        assert prefill[0].received == decode[0].received == []
        key = {"Authorization": "Bearer sk-proxy"}
        assert httpx.post(proxy.url + "/v1/completions", json=BODY, headers=key).is_success
        assert httpx.get(proxy.url + "/health").status_code == 200  # open, as the server's
    assert [r.authorization for r in prefill[0].received + decode[0].received] == [
        "Bearer sk-proxy"
    ] * 2


def test_models_come_from_decode_with_the_clients_key(prefill, decode, proxy):
    answer = httpx.get(proxy.url + "/v1/models", headers={"Authorization": "Bearer c"})
    assert answer.json() == {"object": "list", "data": [{"id": "decode", "auth": "Bearer c"}]}


def test_health_is_ok_when_both_are_and_names_each(prefill, decode, proxy):
    ok = httpx.get(proxy.url + "/health")
    assert ok.status_code == 200 and ok.json()["status"] == "ok"
    assert ok.json()["prefill"] == {"url": prefill[1].url, "status": "ok"}
    assert ok.json()["decode"] == {"url": decode[1].url, "status": "ok"}


@pytest.mark.parametrize(
    "prefill_state, decode_state, expected",
    [
        ("closed", "ok", "degraded"),  # decode computes every prompt
        ("503", "ok", "degraded"),
        ("ok", "closed", "degraded"),  # prefill runs whole requests
        ("ok", "503", "unavailable"),  # decode's 503 is what a client would get
        ("closed", "closed", "unavailable"),
        ("503", "503", "unavailable"),
    ],
)
def test_health_says_degraded_while_the_proxy_still_answers_and_503_only_when_it_cannot(
    prefill, decode, prefill_state, decode_state, expected
):
    """The oracle is a request sent right after: /health is 200 exactly when it is answered
    with a 200 (the fakes answer 200 unless told otherwise)."""
    urls = {}
    for name, (fake, server), state in (
        ("prefill", prefill, prefill_state),
        ("decode", decode, decode_state),
    ):
        urls[name] = closed_url() if state == "closed" else server.url
        if state == "503":
            fake.health_status = fake.status = 503
    with proxy_of(urls["prefill"], urls["decode"], prefill_timeout_s=1) as proxy:
        health = httpx.get(proxy.url + "/health", timeout=10)
        answer = httpx.post(proxy.url + "/v1/completions", json=BODY, timeout=10)
    assert health.json()["status"] == expected
    assert health.status_code == (503 if expected == "unavailable" else 200)
    assert (health.status_code == 200) == (answer.status_code == 200)
    if "closed" in (prefill_state, decode_state):
        closed = "prefill" if prefill_state == "closed" else "decode"
        assert health.json()[closed]["status"].startswith("unreachable: ConnectError")


@pytest.mark.parametrize("ask_health", [True, False])
def test_a_proxy_started_before_prefill_uses_it_once_it_is_up(decode, ask_health):
    """Started together, as the README shows: the proxy's first poll finds no prefill server,
    and its watcher would not poll again for 100 s here. Yet once the proxy's /health says 200,
    every request goes through prefill; and without /health asked, so does the first request
    after prefill came up. The oracle: POSTs reaching the prefill server, and the transfer
    named to decode."""
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
    fake = Fake("prefill")
    with proxy_of(f"http://127.0.0.1:{port}", decode[1].url, health_check_interval_s=100) as proxy:
        state = proxy.server.config.app.state.proxy
        wait_for(lambda: state.prefill_down is not None, "the first poll")
        httpx.post(proxy.url + "/v1/completions", json=BODY)  # skips prefill: it is down
        assert decode[0].received[-1].body == BODY
        with ServerThread(fake.app(), port=port):
            if ask_health:
                health = httpx.get(proxy.url + "/health")
                assert health.status_code == 200 and health.json()["status"] == "ok"
            for _ in range(5):
                assert httpx.post(proxy.url + "/v1/completions", json=BODY).status_code == 200
    assert len(fake.received) == 5
    params = [r.body["kv_transfer_params"] for r in decode[0].received[1:]]
    assert len(params) == 5 and all(p["do_remote_prefill"] for p in params)


@pytest.mark.parametrize("name", ["prefill", "decode"])
def test_each_engines_event_stream_is_reachable_under_its_name(prefill, decode, proxy, name):
    fake = prefill[0] if name == "prefill" else decode[0]
    with httpx.stream("GET", f"{proxy.url}/{name}/v1/events?since=3&x=y", timeout=WAIT_S) as r:
        assert r.status_code == 200
        line = next(r.iter_lines())
    assert json.loads(line.removeprefix("data: ")) == {"server": name, "query": "since=3&x=y"}
    wait_for(fake.gone.is_set, f"the {name} server to see the viewer leave")


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prefill", "http://a:1"], "--prefill is the proxy's flag: add --disagg-proxy"),
        (["--decode", "http://a:1"], "--decode is the proxy's flag: add --disagg-proxy"),
        (["--disagg-proxy"], "--disagg-proxy needs --prefill URL and --decode URL"),
        (["--disagg-proxy", "--prefill", "http://a:1"], "--disagg-proxy needs --decode URL"),
        (
            ["--disagg-proxy", "--prefill", "http://a:1", "--decode", "http://b:2", "./ckpt"],
            "MODEL is a model server's flag",
        ),
        (
            ["--disagg-proxy", "--prefill", "http://a:1", "--decode", "http://b:2"]
            + ["--max-num-seqs", "4"],
            "--max-num-seqs is a model server's flag",
        ),
        (
            ["--disagg-proxy", "--prefill", "a:1", "--decode", "http://b:2"],
            "the prefill address must be http://HOST:PORT, got 'a:1'",
        ),
    ],
)
def test_proxy_flags_are_refused_clearly(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


PROBE = """
import argparse, sys
from nanovllm.serve.cli import add_arguments, proxy_options
from nanovllm.serve.disagg_proxy import build_proxy_app
parser = argparse.ArgumentParser()
add_arguments(parser)
args = parser.parse_args(["--disagg-proxy", "--prefill", "http://a:1", "--decode", "http://b:2",
                          "--api-key", "k", "--port", "9"])
options = proxy_options(args)
build_proxy_app(**options)
print(sorted(options.items()), "torch" in sys.modules)
"""


def test_the_proxy_is_built_from_its_flags_without_torch():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "[('api_key',",
        "'k'),",
        "('body_timeout',",
        "60.0),",
        "('decode_url',",
        "'http://b:2'),",
        "('health_check_interval_s',",
        "2.0),",
        "('max_concurrent_requests',",
        "1024),",
        "('max_request_body_bytes',",
        "2097152),",
        "('prefill_timeout_s',",
        "10.0),",
        "('prefill_url',",
        "'http://a:1')]",
        "False",
    ]
