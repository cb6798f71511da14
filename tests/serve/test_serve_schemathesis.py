"""Property-based API testing: schemathesis derives requests, valid and invalid, from the
server's own OpenAPI schema; whatever it sends, the server must never answer 5xx.

Bounded for CI: a short-context engine (every generation is short) and a fixed example budget.
"""

from __future__ import annotations

import pytest
from budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_support import wait_idle

from nanovllm import EngineConfig, LLMEngine
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def small_server(model_path):
    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=str(model_path), max_model_len=48)))
    with ServerThread(build_app(engine)) as server:
        yield server, engine
    engine.shutdown()


def test_no_request_from_the_schema_gets_a_server_error(small_server):
    from schemathesis import GenerationMode

    server, engine = small_server
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json").exclude(
        path_regex="events"  # an endless stream: nothing to fuzz, and it never returns
    )
    cases = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE)
    )
    seen: list[int] = []

    @settings(
        max_examples=examples(60),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def check(case) -> None:
        response = case.call(base_url=server.url, timeout=30)
        seen.append(response.status_code)
        assert response.status_code < 500, (
            f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}\n"
            f"body: {case.body!r}"
        )

    check()
    assert any(code == 200 for code in seen) and any(code == 400 for code in seen)
    wait_idle(engine)
