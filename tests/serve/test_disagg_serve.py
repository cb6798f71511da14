"""Disaggregated serving end to end: a prefill server and a decode server joined by the
P2pConnector, the proxy in front, an OpenAI client talking to the proxy.

The oracle is one ordinary server on the same checkpoint (the session's): through the proxy the
answers are the same, completions and chat, streamed or not, with n=2 and stop strings; the decode engine's external
prefix-cache hits show that the prompts were received, not computed. Faults: a client hanging up
mid-stream leaves no block allocated on either engine; a prompt larger than the decode engine's
whole KV cache is a 400 naming its length while other requests keep running; a decode server
that is down is replaced by the prefill server for the whole request.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from serve_support import CHAT_TEMPLATE

from nanovllm import EngineConfig, LLMEngine
from nanovllm.kv_transfer.secret import kv_secret, transfer_signature
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.disagg_proxy import build_proxy_app
from nanovllm.serve.server import ServerThread

# Prompts long enough to fill several 4-token blocks (what the producer sends).
LONG = [[(11 * i + 5 * j) % 200 + 3 for j in range(21 + 4 * i)] for i in range(5)]
DECODE_KV_BLOCKS = 24  # 96 slots: the n=2 requests preempt each other on the decode engine
WAIT_S = 30.0
TIMEOUT_S = 1.5  # the decode engine's wait for a transfer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine(model_path, role: str, port: int, **options: Any) -> AsyncLLMEngine:
    config = {"kv_connector": "P2pConnector", "kv_role": role, "kv_port": port}
    if role == "kv_consumer":
        config["kv_connector_extra_config"] = {"timeout_s": TIMEOUT_S}
    return AsyncLLMEngine(
        LLMEngine(
            EngineConfig(model=str(model_path), block_size=4, kv_transfer_config=config, **options)
        )
    )


class Disagg:
    """Two engines, their servers and the proxy, started together and stopped together."""

    def __init__(self, model_path) -> None:
        port = free_port()
        self.decode = engine(model_path, "kv_consumer", port, num_kv_blocks=DECODE_KV_BLOCKS)
        self.prefill = engine(model_path, "kv_producer", port)
        self.decode_server = ServerThread(
            build_app(self.decode, chat_template=CHAT_TEMPLATE)
        ).start()
        self.prefill_server = ServerThread(
            build_app(self.prefill, chat_template=CHAT_TEMPLATE)
        ).start()
        self.proxy = ServerThread(
            build_proxy_app(self.prefill_server.url, self.decode_server.url)
        ).start()

    def stop(self) -> None:
        for server in (self.proxy, self.prefill_server, self.decode_server):
            server.stop()
        for e in (self.prefill, self.decode):
            e.shutdown()

    def blocks_in_use(self) -> list[int]:
        """Each engine's allocated blocks, once it is idle."""
        used = []
        for e in (self.prefill, self.decode):
            deadline = time.monotonic() + WAIT_S
            while e.engine.has_unfinished_requests() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert e.sync()
            used.append(e.engine.kv_cache_manager.num_used_blocks)
        return used


@pytest.fixture(scope="module")
def disagg(model_path) -> Iterator[Disagg]:
    pair = Disagg(model_path)
    yield pair
    pair.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def answer(c: openai.OpenAI, model: str, extra_body: dict | None = None, **kwargs: Any) -> list:
    extra_body = {"ignore_eos": True, **(extra_body or {})}
    kwargs = {"temperature": 0, **kwargs}
    result = c.completions.create(model=model, extra_body=extra_body, **kwargs)
    usage = (result.usage.prompt_tokens, result.usage.completion_tokens)
    return [(ch.index, ch.text, ch.finish_reason) for ch in result.choices] + [usage]


def streamed(c: openai.OpenAI, model: str, prompt: list[int]) -> tuple[str, str | None]:
    chunks = list(
        c.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    return "".join(ch.choices[0].text for ch in chunks), chunks[-1].choices[0].finish_reason


def test_through_the_proxy_two_engines_answer_as_one(disagg, server, async_engine) -> None:
    model = async_engine.model_name
    via, one = client(disagg.proxy.url), client(server.url)
    hits_before = disagg.decode.engine.scheduler.external_prefix_cache_hits
    for prompt in LONG[:3]:
        assert answer(via, model, prompt=prompt, max_tokens=16) == answer(
            one, model, prompt=prompt, max_tokens=16
        )
    sampled = dict(prompt=LONG[3], max_tokens=10, n=2, temperature=0.8, seed=7)  # n > 1 samples
    assert answer(via, model, **sampled) == answer(one, model, **sampled)
    plain = answer(one, model, prompt=LONG[1], max_tokens=16)
    stop = plain[0][1][4:7]  # a piece of the greedy text: the answer ends before it
    stopped = answer(one, model, prompt=LONG[1], max_tokens=16, stop=[stop])
    assert stopped[0][2] == "stop"
    assert answer(via, model, prompt=LONG[1], max_tokens=16, stop=[stop]) == stopped
    assert streamed(via, model, LONG[4]) == streamed(one, model, LONG[4])
    # The decode engine loaded the prompts' full blocks instead of computing them.
    assert disagg.decode.engine.scheduler.external_prefix_cache_hits > hits_before
    assert disagg.blocks_in_use() == [0, 0]


def test_chat_through_the_proxy_answers_as_one_server(disagg, chat_server, async_engine) -> None:
    """/v1/chat/completions, streamed and not: the proxy rewrites the chat body for prefill
    (max_completion_tokens 1) and relays decode's answer."""
    model = async_engine.model_name
    messages = [{"role": "user", "content": "abc def ghi jkl mno " * 2}]

    def chat(url: str) -> tuple[str, str, str]:
        c = client(url)
        common = dict(
            model=model, messages=messages, temperature=0, extra_body={"ignore_eos": True}
        )
        whole = c.chat.completions.create(**common, max_completion_tokens=10)
        chunks = list(c.chat.completions.create(**common, max_tokens=10, stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        return whole.choices[0].message.content, whole.choices[0].finish_reason, text

    hits_before = disagg.decode.engine.scheduler.external_prefix_cache_hits
    assert chat(disagg.proxy.url) == chat(chat_server.url)
    assert disagg.decode.engine.scheduler.external_prefix_cache_hits > hits_before
    assert disagg.blocks_in_use() == [0, 0]


def test_a_client_hanging_up_mid_stream_leaks_no_block(disagg, async_engine) -> None:
    body = {
        "model": async_engine.model_name,
        "prompt": LONG[2],
        "max_tokens": 60,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", disagg.proxy.url + "/v1/completions", json=body, timeout=WAIT_S) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # decoding has begun
    assert disagg.blocks_in_use() == [0, 0]


def test_a_prompt_larger_than_the_decode_engines_cache_is_refused_by_length(
    disagg, server, async_engine
) -> None:
    model = async_engine.model_name
    too_long = LONG[4] * 4  # 148 tokens: more than the decode engine's 96 slots
    with pytest.raises(openai.BadRequestError, match=str(len(too_long))):
        answer(client(disagg.proxy.url), model, prompt=too_long, max_tokens=4)
    # The others keep being served, and nothing is left allocated.
    assert answer(client(disagg.proxy.url), model, prompt=LONG[0], max_tokens=8) == answer(
        client(server.url), model, prompt=LONG[0], max_tokens=8
    )
    assert disagg.blocks_in_use() == [0, 0]


def test_a_transfer_that_never_comes_is_waited_for_then_computed(
    disagg, server, async_engine
) -> None:
    """Straight to the decode server, naming a transfer nobody sends: it waits `timeout_s`
    without holding the event loop (another request is answered meanwhile), then computes."""
    model = async_engine.model_name
    lost = {"do_remote_prefill": True, "transfer_id": "never-sent"}
    lost["signature"] = transfer_signature(kv_secret(), "never-sent")  # as the proxy signs
    expected = answer(client(server.url), model, prompt=LONG[3], max_tokens=8)
    result: list = []
    waiting = threading.Thread(
        target=lambda: result.append(
            answer(
                client(disagg.decode_server.url),
                model,
                prompt=LONG[3],
                max_tokens=8,
                extra_body={"kv_transfer_params": lost},
            )
        )
    )
    start = time.monotonic()
    waiting.start()
    assert answer(client(disagg.decode_server.url), model, prompt=LONG[0], max_tokens=4)
    assert time.monotonic() - start < TIMEOUT_S  # answered while the other waits
    waiting.join(WAIT_S)
    assert time.monotonic() - start >= TIMEOUT_S
    assert result == [expected]
    assert disagg.blocks_in_use() == [0, 0]


def test_only_the_proxy_names_a_transfer_a_client_is_refused_at_once(disagg) -> None:
    """A made-up transfer id, unsigned or signed with another secret, straight to either
    server: a 403 naming `kv_transfer_params`, at once (it would have held the request, and a
    concurrency slot, for the decode engine's whole `timeout_s`). The proxy's own still pass."""
    forged = transfer_signature("another secret", "made-up")
    for server in (disagg.decode_server, disagg.prefill_server):
        for signature in ({}, {"signature": forged}, {"signature": 7}):
            params = {"do_remote_prefill": True, "transfer_id": "made-up", **signature}
            body = {"prompt": LONG[0], "max_tokens": 4, "kv_transfer_params": params}
            start = time.monotonic()
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=WAIT_S)
            assert r.status_code == 403, r.text
            assert time.monotonic() - start < TIMEOUT_S
            error = r.json()["error"]
            assert error["param"] == "kv_transfer_params" and "proxy" in error["message"]
    hits_before = disagg.decode.engine.scheduler.external_prefix_cache_hits
    via = client(disagg.proxy.url)
    assert via.completions.create(model=disagg.decode.model_name, prompt=LONG[1], max_tokens=4)
    assert disagg.decode.engine.scheduler.external_prefix_cache_hits > hits_before
    assert disagg.blocks_in_use() == [0, 0]


def test_viz_reaches_each_engines_events_through_the_proxy(disagg) -> None:
    from nanovllm.viz.connect import ConnectDriver

    for side, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        driver = ConnectDriver(disagg.proxy.url + "/" + side, lambda state, status: None, speed=0)
        assert driver.events_url == f"{disagg.proxy.url}/{side}/v1/events"
        with httpx.stream("GET", driver.events_url, timeout=WAIT_S) as events:
            first = next(line for line in events.iter_lines() if line.startswith("data:"))
        started = json.loads(first.removeprefix("data: "))
        assert started["kind"] == "engine_started" and started["kv_role"] == role


def test_with_the_decode_server_down_the_prefill_server_answers_alone(
    model_path, server, async_engine
) -> None:
    pair = Disagg(model_path)
    try:
        pair.decode_server.stop()
        model = async_engine.model_name
        assert answer(client(pair.proxy.url), model, prompt=LONG[2], max_tokens=12) == answer(
            client(server.url), model, prompt=LONG[2], max_tokens=12
        )
        assert pair.blocks_in_use() == [0, 0]
    finally:
        pair.stop()
