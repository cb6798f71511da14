"""Bad requests get OpenAI-shaped 400s naming the field, and never disturb the others."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from serve_support import MAX_TOKENS, PROMPTS, wait_idle

BAD_BODIES = [
    # (body changes, the param the error must name)
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"logprobs": 99}, "logprobs"),
    ({"seed": 2**70}, "seed"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    (
        {"n": 2, "temperature": 0},
        "n",
    ),  # n greedy completions (vLLM's 400)  # more completions than one request may ask for (MAX_N)
    ({"stop": [""]}, "stop"),
    ({"stop": ["a", 3]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids.0"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"logit_bias": {"1000000": 1.0}}, "logit_bias"),  # outside the vocabulary
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [1000000]}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words.0"),
    ({"bad_words": ["\ud800"]}, "bad_words.0"),
    ({"use_beam_search": True}, "use_beam_search"),  # vLLM's, not implemented: never ignored
    # Only `false`, as the schema says: 0 equals False in Python, not in JSON.
    ({"use_beam_search": 0}, "use_beam_search"),
    ({"return_token_ids": 0}, "return_token_ids"),
    ({"return_token_offsets": 0}, "return_token_offsets"),
    ({"watermarking": 0}, "watermarking"),
    ({"echo": 0}, "echo"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt"),  # a batch with an empty prompt
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": "\ud800"}, "prompt"),
    ({"prompt": [3] * 600}, "prompt"),  # longer than max_model_len
    ({"prompt": None}, "prompt"),
    ({"temperature": float("nan")}, "temperature"),
    ({"stream": "yes please"}, "stream"),
    ({"priority": 1}, "priority"),
    # Strict types: a boolean or a string is not a number (pydantic's default coerces both).
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": "1"}, "max_tokens"),
    ({"n": True}, "n"),
    ({"ignore_eos": "true"}, "ignore_eos"),
    # A token id is written one way only: int() reads each of these as 5.
    ({"logit_bias": {"05": 1.0}}, "logit_bias"),
    ({"logit_bias": {" 5": 1.0}}, "logit_bias"),
    ({"logit_bias": {"\u0665": 1.0}}, "logit_bias"),  # an Arabic-Indic five
    ({"stop_token_ids": [1000000]}, "stop_token_ids"),  # outside the vocabulary
]


def test_bad_requests_are_400s_while_streams_go_on(server, async_engine, offline_texts):
    wait_idle(async_engine)
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    async def good(prompt) -> str:
        pieces = []
        stream = await aclient.completions.create(
            model=async_engine.model_name,
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            pieces.append(chunk.choices[0].text)
        return "".join(pieces)

    async def bad(client: httpx.AsyncClient, changes: dict) -> httpx.Response:
        request = {"model": async_engine.model_name, "prompt": "hello", **changes}
        # json.dumps, not httpx's json=: it escapes lone surrogates and writes NaN.
        content = json.dumps(request).encode()
        headers = {"content-type": "application/json"}
        return await client.post("/v1/completions", content=content, headers=headers)

    async def main():
        async with aclient, httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            goods = [asyncio.create_task(good(p)) for p in PROMPTS[:6]]
            while async_engine.stats.num_running == 0:  # the streams are under way
                await asyncio.sleep(0.005)
            bads = await asyncio.gather(*(bad(client, changes) for changes, _ in BAD_BODIES))
            return await asyncio.gather(*goods), bads

    texts, responses = asyncio.run(main())
    assert texts == offline_texts[:6]
    for (changes, param), response in zip(BAD_BODIES, responses):
        assert response.status_code == 400, (changes, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param, (changes, error)
        assert error["message"] and "code" in error
    wait_idle(async_engine)
    assert async_engine.engine.kv_cache_manager.num_used_blocks == 0


def test_openai_client_raises_bad_request_naming_the_field(server, async_engine):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=async_engine.model_name, prompt="x", top_p=7)
    assert info.value.status_code == 400
    assert info.value.body["param"] == "top_p"
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x")
    assert info.value.body["code"] == "model_not_found"


def test_protocol_errors_are_openai_shaped(server):
    with httpx.Client(base_url=server.url) as client:
        not_json = client.post(
            "/v1/completions", content=b"{oops", headers={"content-type": "application/json"}
        )
        assert not_json.status_code == 400
        assert not_json.json()["error"]["code"] == "json_invalid"
        missing = client.post("/v1/completions", json={})
        assert missing.status_code == 400
        assert missing.json()["error"]["param"] == "prompt"
        chat_missing = client.post("/v1/chat/completions", json={"messages": []})
        assert chat_missing.status_code == 400
        assert chat_missing.json()["error"]["param"] == "messages"
        unknown = client.get("/v1/nothing-here")
        assert unknown.status_code == 404 and "error" in unknown.json()
        wrong_method = client.get("/v1/completions")
        assert wrong_method.status_code == 405 and "error" in wrong_method.json()


@pytest.mark.parametrize("key", [lambda i: str(10**6 + i), lambda i: f"0{i}"])
def test_a_huge_bad_logit_bias_gets_a_short_error_naming_a_few(server, key):
    """60,000 bad keys (under the 65,536 entries any object may hold): the error names the
    first few and the count, not every one."""
    bias = {key(i): 1.0 for i in range(60_000)}
    response = httpx.post(
        server.url + "/v1/completions", json={"prompt": "x", "logit_bias": bias}, timeout=60
    )
    assert response.status_code == 400
    assert len(response.content) < 1000, len(response.content)
    error = response.json()["error"]
    assert error["param"] == "logit_bias"
    assert key(0) in error["message"] and "59,995 more" in error["message"], error


def test_a_masked_tokens_logprob_is_json(server, async_engine):
    """A grammar's mask gives every token it forbids logprob -inf, which JSON has no number for
    (it was a 500): sent as -9999.0, as vLLM does."""
    pytest.importorskip("xgrammar")
    body = {"prompt": "x", "max_tokens": 3, "logprobs": 5, "temperature": 0, "prompt_logprobs": 1,
            "repetition_penalty": 1e16, "structured_outputs": {"json_object": True}}  # fmt: skip
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    top = response.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert min(v for entry in top for v in entry.values()) == -9999.0, top
    wait_idle(async_engine)


@pytest.mark.parametrize("field", ["continue_final_message", "echo", "add_special_tokens"])
def test_a_chat_neutral_boolean_takes_false_only_as_its_schema_says(chat_server, field):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, field: 0}
    response = httpx.post(chat_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field, response.text
