"""Property-based API testing: schemathesis derives requests, valid and invalid, from the
server's own OpenAPI schema (`nanovllm/serve/openapi.py`), and runs all of its checks on each
answer: no 5xx, every status and body as documented, a schema-valid request accepted and a
schema-violating one refused, the API key required where the schema says so.

The rules JSON Schema cannot state (token counts, `min_tokens` <= `max_tokens`, constraints
that compile) are applied to the generated bodies by `schemathesis_hooks.py`, as in the
command-line run documented in nanovllm/serve/README.md. Bounded for CI: a short-context engine
and a fixed example budget.
"""

from __future__ import annotations

import pytest
from budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_support import CHAT_TEMPLATE, wait_idle

from nanovllm import EngineConfig, LLMEngine
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread

schemathesis = pytest.importorskip("schemathesis")
KEY = "sk-schemathesis"
MAX_MODEL_LEN = 48


@pytest.fixture(scope="module")
def small_server(model_path, monkeypatch_module):
    monkeypatch_module.setenv("NANOVLLM_MAX_MODEL_LEN", str(MAX_MODEL_LEN))
    import schemathesis_hooks  # noqa: F401 - registers the hook (reads the variable above)

    config = EngineConfig(model=str(model_path), max_model_len=MAX_MODEL_LEN)
    engine = AsyncLLMEngine(LLMEngine(config))
    with ServerThread(build_app(engine, chat_template=CHAT_TEMPLATE, api_key=KEY)) as server:
        yield server, engine
    engine.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_no_check_fails_and_valid_generation_requests_reach_the_engine(small_server):
    from schemathesis import GenerationMode

    server, engine = small_server
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json").exclude(
        path_regex="events"  # an endless stream: nothing to fuzz, and it never returns
    )
    positive, negative = (
        schema.as_strategy(GenerationMode.POSITIVE),
        schema.as_strategy(GenerationMode.NEGATIVE),
    )
    seen: list[tuple[bool, str, int]] = []  # (positive?, path, status)

    @settings(
        max_examples=examples(60),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def check(data) -> None:
        is_positive = data.draw(st.booleans())
        case = data.draw(positive if is_positive else negative)
        # The key (the schema's bearer scheme has schemathesis make up one of its own); its
        # `ignored_auth` check sends the request again without it, expecting a 401.
        headers = {"Authorization": f"Bearer {KEY}"}
        response = case.call(base_url=server.url, timeout=30, headers=headers)
        seen.append((is_positive, case.path, response.status_code))
        assert response.status_code < 500, (case.path, response.text[:300], case.body)
        case.validate_response(response, headers=headers)  # every check schemathesis has

    check()
    generation = [code for ok, path, code in seen if ok and "completions" in path]
    assert generation and sum(code == 200 for code in generation) > len(generation) / 2, seen
    # Negative mode's requests are refused: a 400 for a bad body, a 401 for the bad auth header
    # it also makes up. (Unknown body fields are no longer schema-invalid: they are ignored, as
    # vLLM does, so they no longer give most of its 400s; a run of few examples may then draw
    # no bad body, which is why 401s count here.)
    assert any(code in (400, 401) for ok, _, code in seen if not ok), seen
    wait_idle(engine)


# Bodies schemathesis found the schema and the server disagreeing on (issue 54): each must be
# schema-invalid and refused, or schema-valid and accepted.
DISPUTED = [
    ("/v1/completions", {"bad_words": ["\u000b"]}),
    ("/v1/completions", {"bad_words": [" \u3000x"]}),
    ("/v1/completions", {"bad_words": ["\ufeff"]}),  # not whitespace to Python: a word
    ("/v1/completions", {"use_beam_search": 0}),
    ("/v1/completions", {"return_token_ids": 0}),
    ("/v1/completions", {"return_token_offsets": 0}),
    ("/v1/completions", {"watermarking": 0}),
    ("/v1/completions", {"watermarking": False}),
    ("/v1/completions", {"priority": 0.0}),  # JSON Schema's 0
    ("/v1/completions", {"priority": False}),
    ("/v1/chat/completions", {"continue_final_message": 0}),
    ("/v1/chat/completions", {"echo": 0}),
]


@pytest.mark.parametrize(("path", "fields"), DISPUTED)
def test_the_schema_and_the_server_agree_on_each_disputed_body(small_server, path, fields):
    import httpx
    import jsonschema

    server, _ = small_server
    headers = {"Authorization": f"Bearer {KEY}"}
    document = httpx.get(server.url + "/openapi.json", timeout=30).json()
    operation = document["paths"][path]["post"]
    body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    schema = {**body_schema, "components": document["components"]}
    if "chat" in path:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    else:
        body = {"prompt": "hi", "max_tokens": 1, **fields}
    valid = jsonschema.Draft202012Validator(schema).is_valid(body)
    response = httpx.post(server.url + path, json=body, headers=headers, timeout=60)
    assert response.status_code == (200 if valid else 400), (valid, response.text)
