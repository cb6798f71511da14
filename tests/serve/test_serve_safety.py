"""A server that lets no one in who should not be: API key, size and concurrency limits, and
nothing a client sends can read a file or make the server connect anywhere.

Every server here listens on 127.0.0.1 only, and every client is the official `openai` one
unless the test needs raw HTTP (a missing header, a chunked body).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import httpx
import openai
import pytest
from serve_support import CHAT_TEMPLATE, wait_idle

from nanovllm.serve.api_server import build_app
from nanovllm.serve.server import ServerThread

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def locked(async_engine) -> Iterator[ServerThread]:
    """An API key, a small body limit and room for two generation requests at a time."""
    app = build_app(
        async_engine,
        chat_template=CHAT_TEMPLATE,
        api_key=KEY,
        max_request_body_bytes=4096,
        max_concurrent_requests=2,
    )
    with ServerThread(app) as running:
        yield running


def client(server: ServerThread, key: str = KEY, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, **kwargs)


def test_binds_loopback_by_default(locked):
    assert locked.server.servers[0].sockets[0].getsockname()[0] == "127.0.0.1"


def test_api_key_guards_every_v1_route(locked, async_engine):
    model = async_engine.model_name
    with pytest.raises(openai.AuthenticationError) as info:
        client(locked, key="sk-wrong").completions.create(model=model, prompt="x", max_tokens=1)
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"
    assert info.value.body["type"] == "invalid_request_error"
    # Without any Authorization header (raw HTTP): every /v1 route and the /events alias.
    routes = [
        ("GET", "/v1/models"),
        ("GET", f"/v1/models/{model}"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/events"),
        ("GET", "/events"),
        ("GET", "/v1/no-such-route"),
    ]
    with httpx.Client(base_url=locked.url, timeout=30) as raw:
        for method, path in routes:
            # Streamed, so that an event stream let through by mistake fails instead of hanging.
            with raw.stream(method, path, json={} if method == "POST" else None) as response:
                assert response.status_code == 401, path
                assert json.loads(response.read())["error"]["code"] == "invalid_api_key"
                assert response.headers["www-authenticate"] == "Bearer"
        bad = {"Authorization": f"Bearer {KEY}x"}
        assert raw.get("/v1/models", headers=bad).status_code == 401
        assert raw.get("/v1/models", headers={"Authorization": KEY}).status_code == 401
        # The scheme is case-insensitive; /health and /metrics stay open (no prompts there).
        assert raw.get("/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
        assert raw.get("/health").status_code == 200
        assert raw.get("/metrics").status_code == 200
    # With the key, the openai client gets answers.
    result = client(locked).completions.create(
        model=model, prompt="ROMEO:", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert result.usage.completion_tokens == 3
    assert [m.id for m in client(locked).models.list().data] == [model]


def test_request_bodies_over_the_limit_get_413(locked, async_engine):
    model = async_engine.model_name
    with pytest.raises(openai.APIStatusError) as info:
        client(locked).completions.create(model=model, prompt="x" * 5000, max_tokens=1)
    assert info.value.status_code == 413
    assert info.value.body["code"] == "request_too_large"
    assert "4096 bytes" in info.value.body["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    response = httpx.post(
        locked.url + "/v1/completions", content=chunks(), headers=headers, timeout=30
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_prompts_over_max_model_len_get_400(locked, async_engine):
    max_model_len = async_engine.engine.max_model_len
    too_long = [5] * (max_model_len + 1)
    with pytest.raises(openai.BadRequestError) as info:
        client(locked).completions.create(
            model=async_engine.model_name, prompt=too_long, max_tokens=1
        )
    assert info.value.body["param"] == "prompt"
    assert f"prompt of {max_model_len + 1} tokens" in info.value.body["message"]
    assert f"max_model_len={max_model_len}" in info.value.body["message"]
    # Chat: the rendered conversation is what must fit. ("ab " is a few tokens, under 4 KiB.)
    with pytest.raises(openai.BadRequestError) as info:
        client(locked).chat.completions.create(
            model=async_engine.model_name,
            messages=[{"role": "user", "content": "ab " * 1200}],
            max_tokens=1,
        )
    assert info.value.body["param"] == "messages"
    assert f"max_model_len={max_model_len}" in info.value.body["message"]


def test_too_many_concurrent_requests_get_429(locked, async_engine):
    wait_idle(async_engine)
    model = async_engine.model_name
    aclient = openai.AsyncOpenAI(base_url=locked.url + "/v1", api_key=KEY, max_retries=0)

    async def main() -> None:
        async with aclient:
            long = dict(model=model, max_tokens=400, stream=True, extra_body={"ignore_eos": True})
            first = await aclient.completions.create(prompt="ROMEO:", **long)
            second = await aclient.chat.completions.create(
                messages=[{"role": "user", "content": "hi"}], **long
            )
            await first.__anext__()  # both are generating now
            await second.__anext__()
            with pytest.raises(openai.RateLimitError) as info:
                await aclient.completions.create(model=model, prompt="x", max_tokens=1)
            assert info.value.status_code == 429
            assert info.value.response.headers["retry-after"] == "1"
            assert info.value.body["code"] == "rate_limit_exceeded"
            assert info.value.body["type"] == "requests"
            assert "2 concurrent requests" in info.value.body["message"]
            # Only generation is counted: the rest of the API still answers.
            assert (await aclient.models.list()).data[0].id == model
            await first.close()  # leaving frees the slots
            await second.close()

    asyncio.run(main())
    wait_idle(async_engine)
    # A refused request (400) gives its slot back too: two of them, then a good one.
    c = client(locked)
    for _ in range(2):
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model=model, prompt="x", top_p=7)
    assert c.completions.create(model=model, prompt="x", max_tokens=2).usage.completion_tokens


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket nobody should connect to: the test checks that nobody did."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    yield sock
    sock.close()


def test_nothing_a_client_sends_reads_a_file_or_reaches_a_host(locked, async_engine, listener):
    model = async_engine.model_name
    c = client(locked)
    here = f"http://127.0.0.1:{listener.getsockname()[1]}/x.png"
    # A template (or its arguments) cannot come from the client: the server's is the only one.
    for field in ("chat_template", "chat_template_kwargs", "tools", "documents"):
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                extra_body={field: "{% include '/etc/passwd' %}"},
            )
        assert info.value.body["param"] == field
    # Template syntax in a message is text: it reaches the model as written.
    content = "{{ 7 * 7 }}{% include '/etc/passwd' %}{{ cycler.__init__.__globals__ }}"
    reply = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=1
    )
    tokenizer = locked.server.config.app.state.serving.tokenizer
    literal = f"user: {content}\nassistant:"
    assert reply.usage.prompt_tokens == len(tokenizer.encode(literal, add_special_tokens=False))
    # Only text parts: an image, audio or file part is refused, never fetched or opened.
    for part in (
        {"type": "image_url", "image_url": {"url": here}},
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
        {"type": "file", "file": {"file_id": "/etc/passwd"}},
    ):
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model=model, messages=[{"role": "user", "content": [part]}])
        assert info.value.body["code"] == "unsupported_parameter"
    # A model name is compared with the served name, never opened as a path.
    for name in ("/etc/passwd", "../../../etc/passwd", here):
        with pytest.raises(openai.NotFoundError) as info:
            c.completions.create(model=name, prompt="x", max_tokens=1)
        assert info.value.body["code"] == "model_not_found"
    with httpx.Client(base_url=locked.url, headers={"Authorization": f"Bearer {KEY}"}) as raw:
        assert raw.get("/v1/models/..%2F..%2Fetc%2Fpasswd").status_code == 404
    # A path or a URL as the prompt (or as the user field) is just text.
    echoed = c.completions.create(
        model=model, prompt="/etc/passwd", max_tokens=1, echo=True, user=here
    )
    assert echoed.choices[0].text.startswith("/etc/passwd")
    assert echoed.usage.prompt_tokens == len(tokenizer.encode("/etc/passwd"))
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing connected to it
