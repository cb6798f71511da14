"""Bodies the JSON parser cannot take get errors that say why (body.py, checked in guard.py).

Oracles: the bytes the test built (where it put the bad byte, how deep it nested, which
Content-Type it sent), and for `json_depth` the depth of the Python value that json.dumps wrote.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.serve.body import MAX_JSON_DEPTH, json_depth

JSON = {"content-type": "application/json"}


def depth_of(value: object) -> int:
    """The oracle: how deep lists and dicts nest in a Python value (recursive, small values)."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


# Strings full of the characters that could fool a scanner: brackets, quotes, backslashes.
tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\ab:,\n\u00e9\U0001f600'), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=examples(300), deadline=None)
@given(value=json_values, indent=st.none() | st.integers(0, 2), ascii=st.booleans())
def test_json_depth_is_the_nesting_of_the_value(value, indent, ascii):
    body = json.dumps(value, indent=indent, ensure_ascii=ascii).encode()
    assert json_depth(body) == depth_of(value)


def test_json_depth_of_200000_levels_is_quick_and_exact():
    body = b"[" * 200_000 + b"]" * 200_000
    start = time.monotonic()
    assert json_depth(body) == 200_000
    assert time.monotonic() - start < 2


def post(server, content: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/completions", content=content, headers=headers or JSON, timeout=60
    )


def nested(depth: int, opener: bytes = b"[", closer: bytes = b"]") -> bytes:
    """A completions body with an unknown field holding `depth` levels in all."""
    return (
        b'{"prompt": "hi", "max_tokens": 1, "x": '
        + opener * (depth - 1)
        + closer * (depth - 1)
        + b"}"
    )


@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a": ', b"}")])
def test_deep_json_is_refused_naming_the_limit(server, opener, closer):
    start = time.monotonic()
    response = post(server, nested(200_000, opener, closer))
    assert time.monotonic() - start < 10
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "json_too_deep"
    assert "200000 levels" in error["message"] and f"at most {MAX_JSON_DEPTH}" in error["message"]
    assert httpx.get(server.url + "/health").status_code == 200  # the server is fine


def test_the_depth_limit_is_exact(server):
    at_limit = post(server, nested(MAX_JSON_DEPTH))
    assert at_limit.status_code == 200  # parsed, its unknown field ignored (as vLLM does)
    over = post(server, nested(MAX_JSON_DEPTH + 1))
    assert over.json()["error"]["code"] == "json_too_deep"
    assert f"{MAX_JSON_DEPTH + 1} levels" in over.json()["error"]["message"]


@settings(max_examples=examples(10), deadline=None)
@given(offset=st.integers(0, 40), bad=st.sampled_from([0x80, 0xC0, 0xFF, 0xE2]))
def test_invalid_utf8_names_the_byte_and_its_offset(server, offset, bad):
    text = json.dumps({"prompt": "a plain ascii prompt, long enough", "max_tokens": 1}).encode()
    offset = min(offset, len(text) - 1)
    body = text[:offset] + bytes([bad]) + text[offset:]
    response = post(server, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_utf8"
    assert f"byte 0x{bad:02x} at offset {offset}" in error["message"]


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded", None],
)
def test_json_sent_as_another_type_gets_400_naming_both(server, content_type):
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    # httpx adds no Content-Type to raw content: None really sends none.
    response = httpx.post(server.url + "/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == 400  # vLLM's answer (HTTP's would be 415)
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and error["type"] == "invalid_request_error"
    assert "application/json" in error["message"]
    expected = "no Content-Type header" if content_type is None else repr(content_type)
    assert expected in error["message"]


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "application/vnd.openai+json"]
)
def test_json_types_are_taken(server, content_type):
    body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 2}).encode()
    response = post(server, body, {"content-type": content_type})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("body", [b"\x00{\x00}\x00", b'{"prompt": "a\x00b"}'])
def test_a_nul_byte_is_invalid_json_at_its_offset(server, body):
    response = post(server, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "json_invalid"
    assert f"NUL byte at offset {body.index(0)}" in error["message"]


def test_invalid_json_says_what_and_where(server):
    response = post(server, b'{"prompt": "hi",, "max_tokens": 1}')
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "json_invalid"
    assert "Expecting property name enclosed in double quotes at character 16" in error["message"]


def test_a_batch_of_many_prompts_is_not_read_as_one_prompt_of_ids():
    """The large-body scan counts a prompt's token ids; a batch's list of prompts is not one
    (a batch of 100 texts on a 64-token model was a 400 `context_length_exceeded`)."""
    from nanovllm.serve.body import BodyError, check_items

    batch = json.dumps({"prompt": ["x" * 700] * 100}).encode()
    assert len(batch) > 64 * 2**10
    check_items(batch, max_model_len=64)  # no error: 100 prompts, not 100 ids
    ids = json.dumps({"prompt": [[5] * 30_000]}).encode()  # one prompt of the batch too long
    with pytest.raises(BodyError) as info:
        check_items(ids, max_model_len=64)
    assert info.value.code == "context_length_exceeded"
