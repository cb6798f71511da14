"""vLLM's `/tokenize`, `/detokenize`, `/version`, and tool calling in chat.

Oracles: the tokenizer itself (`encode`, `decode`, `convert_ids_to_tokens`), the chat
completion's own `usage.prompt_tokens` for the same messages (tokenize renders as chat does),
the tools' JSON Schemas (a required or named tool call's arguments must validate: the
structured-output constraint guarantees it), and vLLM's response shapes
(`vllm/entrypoints/serve/tokenize/protocol.py`; chat serving's tool_choice branches).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from serve_support import wait_idle

from nanovllm.serve.api_server import build_app
from nanovllm.serve.server import ServerThread

# A template that takes tools (as Hermes-style templates do): their names in a <tools> block.
TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}"
    "</tools>\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>{{ c['function']['name'] }}"
    "</tool_call>{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "weather", "parameters": CITY},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": CITY}},
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server(async_engine) -> Iterator[ServerThread]:
    app = build_app(async_engine, chat_template=TOOLS_TEMPLATE, tool_call_parser="hermes")
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(tool_server):
    return tool_server.server.config.app.state.serving.tokenizer


def test_tokenize_detokenize_and_version(tool_server, tokenizer, async_engine):
    url = tool_server.url
    text = "The quick brown fox"
    reply = httpx.post(url + "/tokenize", json={"prompt": text, "return_token_strs": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["tokens"] == tokenizer.encode(text)
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == async_engine.engine.max_model_len
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(body["tokens"])
    plain = httpx.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert plain.json()["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    assert plain.json()["token_strs"] is None  # the key is always there, as vLLM's
    back = httpx.post(url + "/detokenize", json={"tokens": body["tokens"]}).json()
    assert back == {"prompt": tokenizer.decode(body["tokens"])}
    vocab = async_engine.engine.model_args.vocab_size
    bad = httpx.post(url + "/detokenize", json={"tokens": [vocab]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    version = httpx.get(url + "/version")
    assert version.status_code == 200 and isinstance(version.json()["version"], str)


def test_tokenize_a_chat_counts_what_chat_sends(tool_server, tokenizer, async_engine):
    url = tool_server.url
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for tools in (None, TOOLS):
        body = {"messages": MESSAGES, **({"tools": tools} if tools else {})}
        counted = httpx.post(url + "/tokenize", json=body).json()
        extra = {"tools": tools, "tool_choice": "none"} if tools else {}
        reply = c.chat.completions.create(
            model=async_engine.model_name, messages=MESSAGES, max_tokens=1, **extra
        )
        assert counted["count"] == reply.usage.prompt_tokens
        text = tokenizer.decode(counted["tokens"])
        assert ("<tools>get_weather;get_time;</tools>" in text) == bool(tools)
        assert text.endswith("assistant:")
    bare = httpx.post(
        url + "/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}
    )
    assert not tokenizer.decode(bare.json()["tokens"]).endswith("assistant:")


def _schema_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def test_named_and_required_tool_calls_parse(tool_server, async_engine):
    c = openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0)
    common = dict(model=async_engine.model_name, messages=MESSAGES, tools=TOOLS, max_tokens=200)
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = c.chat.completions.create(tool_choice=named, temperature=0, **common)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_time" and call.id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(call.function.arguments), CITY)
    assert reply.choices[0].message.content == ""
    # Streamed, the same arguments arrive as deltas; the first carries the id and the name.
    pieces, names = [], []
    for chunk in c.chat.completions.create(tool_choice=named, temperature=0, stream=True, **common):
        for ch in chunk.choices:
            for delta in ch.delta.tool_calls or []:
                names.append(delta.function.name)
                pieces.append(delta.function.arguments or "")
    assert names[0] == "get_time" and "".join(pieces) == call.function.arguments

    reply = c.chat.completions.create(tool_choice="required", temperature=0, **common)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), _schema_of(call.function.name))
    wait_idle(async_engine)


def test_tool_choice_rules(tool_server, server, async_engine):
    common = dict(model=async_engine.model_name, messages=MESSAGES, tools=TOOLS, max_tokens=4)
    # "auto" (the default with tools) needs the parser flags.
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="enable-auto-tool-choice"):
        c.chat.completions.create(**common)
    # With them, an output without <tool_call> is the content, finished as it finished.
    t = openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0)
    reply = t.chat.completions.create(temperature=0, **common)
    assert reply.choices[0].finish_reason == "length" and not reply.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError, match="has not been passed"):
        t.chat.completions.create(
            tool_choice={"type": "function", "function": {"name": "nope"}}, **common
        )
    with pytest.raises(openai.BadRequestError, match="`tools` must be set"):
        t.chat.completions.create(
            model=async_engine.model_name, messages=MESSAGES, tool_choice="required"
        )


def test_auto_tool_calls_through_the_hermes_parser(tool_server, async_engine):
    """The model's output held to a Hermes call (a structured-output choice; a random model
    would not write one), read back as vLLM's hermes parser reads it: whole, and streamed as
    deltas the openai client assembles."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    c = openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0)
    common = dict(
        model=async_engine.model_name,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=200,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["Let me see." + call]}},
    )
    reply = c.chat.completions.create(**common)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me see."
    (tool_call,) = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.function.name == "get_weather"
    assert json.loads(tool_call.function.arguments) == {"city": "Paris"}

    content, names, arguments, finish = "", [], "", None
    for chunk in c.chat.completions.create(stream=True, **common):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for delta in ch.delta.tool_calls or []:
                if delta.function.name:
                    names.append(delta.function.name)
                arguments += delta.function.arguments or ""
            finish = ch.finish_reason or finish
    assert (content, names, finish) == ("Let me see.", ["get_weather"], "tool_calls")
    assert json.loads(arguments) == {"city": "Paris"}
