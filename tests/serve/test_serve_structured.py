"""Structured outputs over HTTP: `response_format` (OpenAI's) and `structured_outputs` (vLLM's).

Oracles: `jsonschema.validate` on the parsed output, `re.fullmatch`, membership in the choices;
a constraint that does not compile is a 400 naming the value, and no KV block stays in use.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from serve_support import wait_idle

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 3},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


def test_chat_with_a_json_schema_response_format(chat_server, async_engine):
    client = openai.OpenAI(base_url=chat_server.url + "/v1", api_key="unused", max_retries=0)
    response = client.chat.completions.create(
        model=async_engine.model_name,
        messages=[{"role": "user", "content": "Who are you?"}],
        max_tokens=200,
        temperature=1.0,
        seed=3,
        n=2,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA},
        },
    )
    for choice in response.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content, strict=False), SCHEMA)


def test_completions_with_vllms_structured_outputs_and_a_json_object(server, async_engine):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    choices = ["red", "green", "blue"]
    response = client.completions.create(
        model=async_engine.model_name, prompt="Colour:", max_tokens=50, temperature=1.0,
        seed=1, n=3, extra_body={"structured_outputs": {"choice": choices}},
    )  # fmt: skip
    assert [c.text in choices for c in response.choices] == [True] * 3
    response = client.completions.create(
        model=async_engine.model_name, prompt="Date:", max_tokens=50, temperature=1.0,
        extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]"}},
    )  # fmt: skip
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]", response.choices[0].text)
    response = client.completions.create(
        model=async_engine.model_name, prompt="{", max_tokens=8, temperature=1.0, seed=2,
        extra_body={"response_format": {"type": "json_object"}},
    )  # fmt: skip
    text = response.choices[0].text
    assert text.lstrip().startswith("{"), text


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "no-such-type"}}}}, "response_format", "no-such-type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "json_schema.schema"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "response_format", "(unclosed"),
    ({"structured_outputs": {"grammar": "root ::= root"}}, "response_format",
     "matches no finite string"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "regex"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs", "both"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "param", "named"), BAD)
def test_a_bad_constraint_is_a_400_naming_it(server, async_engine, changes, param, named):
    wait_idle(async_engine)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post(
            "/v1/completions",
            json={"model": async_engine.model_name, "prompt": "x", **changes},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert named in error["message"], error
    wait_idle(async_engine)
    assert async_engine.engine.kv_cache_manager.num_used_blocks == 0
