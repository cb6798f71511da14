"""Fixtures for the server tests: one tiny model, one engine, real servers on loopback.

The engine is shared by the whole session (as a real server's is shared by its clients), so
tests compare counters before and after rather than absolute values, and wait for the engine to
be idle before they look at its KV cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_support import (
    CHAT_TEMPLATE,
    PROMPTS,
    greedy,
    running_engine,
    serving,
    strip_chat_template,
)

from nanovllm import LLM
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> Path:
    from tiny_models import make_model

    path = make_model(tmp_path_factory.mktemp("serve_model"))
    strip_chat_template(path)
    return path


@pytest.fixture(scope="session")
def async_engine(model_path) -> Iterator[AsyncLLMEngine]:
    with running_engine(model_path) as engine:
        yield engine


@pytest.fixture(scope="session")
def server(async_engine) -> Iterator[ServerThread]:
    with serving(async_engine) as running:
        yield running


@pytest.fixture(scope="session")
def chat_server(async_engine) -> Iterator[ServerThread]:
    """A second app on the same engine, with a chat template given (as --chat-template does)."""
    with serving(async_engine, CHAT_TEMPLATE) as running:
        yield running


@pytest.fixture(scope="session")
def offline_llm(model_path) -> LLM:
    return LLM(str(model_path))


@pytest.fixture(scope="session")
def offline_texts(offline_llm) -> list[str]:
    """The oracle: offline greedy outputs of PROMPTS on the same model."""
    outputs = offline_llm.generate(PROMPTS, greedy(), use_tqdm=False)
    return [o.outputs[0].text for o in outputs]
