"""max_tokens against the context: vLLM's server rule, on a 64-token context.

prompt + max_tokens > max_model_len is a 400 naming both numbers (OpenAI's code
`context_length_exceeded`), never a silent cut; prompt + max_tokens <= max_model_len runs to
max_tokens; no max_tokens in a chat means the rest of the context. Oracle: the arithmetic on
the numbers sent (the prompts are token ids, so their lengths are known), and the usage the
server reports for what it ran.
"""

from __future__ import annotations

import httpx
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_support import CHAT_TEMPLATE, wait_idle

from nanovllm import EngineConfig, LLMEngine
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread

CONTEXT = 64


@pytest.fixture(scope="module")
def short(model_path):
    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=str(model_path), max_model_len=CONTEXT)))
    with ServerThread(build_app(engine, chat_template=CHAT_TEMPLATE)) as server:
        yield server, engine
    engine.shutdown()


def vllm_message(max_tokens: int, prompt_tokens: int) -> str:
    return (
        f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
        f"maximum context length is {CONTEXT} tokens and your request has {prompt_tokens} "
        f"input tokens ({max_tokens} > {CONTEXT} - {prompt_tokens})."
    )


def complete(server, prompt_tokens: int, **fields) -> httpx.Response:
    body = {"prompt": [5 + i % 50 for i in range(prompt_tokens)], "ignore_eos": True, **fields}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120)


def test_the_issues_request_gets_vllms_400(short):
    server, engine = short
    for stream in (False, True):  # a stream is refused before it starts
        response = complete(server, 6, max_tokens=1_000_000_000_000, stream=stream)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == {
            "message": vllm_message(1_000_000_000_000, 6),
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "context_length_exceeded",
        }
    wait_idle(engine)
    assert engine.engine.kv_cache_manager.num_used_blocks == 0


@settings(max_examples=examples(12), deadline=None)
@given(prompt_tokens=st.integers(1, CONTEXT - 1), max_tokens=st.integers(1, 2 * CONTEXT))
def test_max_tokens_fits_or_is_refused(short, prompt_tokens, max_tokens):
    server, _ = short
    response = complete(server, prompt_tokens, max_tokens=max_tokens, temperature=0)
    if prompt_tokens + max_tokens > CONTEXT:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"] == vllm_message(max_tokens, prompt_tokens)
    else:
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == max_tokens


@pytest.mark.parametrize("prompt_tokens", [1, CONTEXT // 2, CONTEXT - 1])
def test_the_boundary(short, prompt_tokens):
    server, _ = short
    room = CONTEXT - prompt_tokens
    fits = complete(server, prompt_tokens, max_tokens=room, temperature=0)
    assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == room
    over = complete(server, prompt_tokens, max_tokens=room + 1, temperature=0)
    assert over.status_code == 400
    assert over.json()["error"]["message"] == vllm_message(room + 1, prompt_tokens)


def test_the_completions_default_of_16_is_checked_as_vllm_does(short):
    server, _ = short
    assert complete(server, CONTEXT - 16).status_code == 200
    refused = complete(server, CONTEXT - 15)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == vllm_message(16, CONTEXT - 15)


def test_chat_names_the_field_it_was_given_and_fills_the_context_without_one(short):
    server, _ = short
    messages = [{"role": "user", "content": "hello"}]

    def chat(**fields) -> httpx.Response:
        body = {"messages": messages, "ignore_eos": True, "temperature": 0, **fields}
        return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)

    for field in ("max_tokens", "max_completion_tokens"):
        refused = chat(**{field: CONTEXT})
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == field
        assert refused.json()["error"]["code"] == "context_length_exceeded"
    rest = chat()  # no max_tokens: the rest of the context
    assert rest.status_code == 200, rest.text
    usage = rest.json()["usage"]
    assert usage["total_tokens"] == CONTEXT
    assert rest.json()["choices"][0]["finish_reason"] == "length"


def test_a_prompt_with_no_room_is_still_named_as_the_prompt(short):
    server, _ = short
    response = complete(server, CONTEXT, max_tokens=1)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt" and f"prompt of {CONTEXT} tokens" in error["message"]
