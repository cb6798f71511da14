"""Schemathesis hooks: the server's rules that JSON Schema cannot state, applied to its bodies.

The OpenAPI schema (`nanovllm/serve/openapi.py`) states every rule it can; two remain, written
in the fields' descriptions, because they compare one field with another or count tokens:
`min_tokens` <= `max_tokens`, prompt tokens + `max_tokens` <= `max_model_len`, and a
structured-output constraint (a regex, a grammar, a JSON schema) compiles. Left alone,
schemathesis' schema-valid bodies break them and its `positive_data_acceptance` check reports
the 400 that follows. This hook moves a schema-valid body inside them: it only ever lowers
`max_tokens` and `min_tokens` to values the schema also allows, and swaps a constraint's text
for one of the same type that compiles, so a body that breaks the schema somewhere keeps
breaking it. It also gives a chat without `max_tokens` a small one, so a run finishes in
seconds. It needs the served model's `max_model_len`, from
$NANOVLLM_MAX_MODEL_LEN (default 64).

    SCHEMATHESIS_HOOKS=tests.serve.schemathesis_hooks NANOVLLM_MAX_MODEL_LEN=64 \\
        schemathesis run http://127.0.0.1:8000/openapi.json --checks all -H "Authorization: ..."

The prompt's token count is bounded by its UTF-8 bytes (every tokenizer here is byte-level BPE
or coarser: no token is shorter than a byte), plus the special tokens a text prompt gets, plus
the chat template's own text for a chat.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

from nanovllm.serve.protocol import ChatMessage

MAX_MODEL_LEN = int(os.environ.get("NANOVLLM_MAX_MODEL_LEN", "64"))
MAX_NEW_TOKENS = 8  # a short run: every schema-valid max_tokens above this is lowered to it
TEMPLATE_BYTES_PER_MESSAGE = 16
SPECIAL_TOKENS = 2  # a text prompt is tokenized with the tokenizer's BOS (and EOS) added  # the test template's "role: ...\n", and then "assistant:"


def _bytes(text: Any) -> int:
    return len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0


def _message_bytes(message: Any) -> int:
    """What the test template writes of a message: its role, its text, a few characters."""
    if not isinstance(message, dict):
        return 0
    content = message.get("content")
    if isinstance(content, list):
        text = sum(_bytes(p.get("text")) for p in content if isinstance(p, dict))
    else:
        text = _bytes(content)
    return TEMPLATE_BYTES_PER_MESSAGE + text


def prompt_tokens_at_most(body: dict[str, Any]) -> int | None:
    """An upper bound on the prompt's tokens, or None when the body's prompt is not valid."""
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list):
            return None
        return TEMPLATE_BYTES_PER_MESSAGE + sum(_message_bytes(m) for m in messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _bytes(prompt) + SPECIAL_TOKENS
    return len(prompt) if isinstance(prompt, list) else None


def _valid_message(message: Any) -> bool:
    """Whether a chat message is one the schema allows (the server's own model says)."""
    try:
        parsed = ChatMessage.model_validate(message)
    except ValueError:
        return False
    content = parsed.content if isinstance(parsed.content, list) else []
    return all(part.type == "text" and part.text is not None for part in content)


def _shorten(body: dict[str, Any]) -> None:
    """A prompt too long for the context, made short, still as the schema allows: a text
    prompt cut to its first character, chat messages' texts emptied (every message is kept:
    one that breaks the schema must still be there)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        body["prompt"] = prompt[:1]
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        body["prompt"] = [prompt[0][:1]]
    messages = body.get("messages")
    if isinstance(messages, list) and messages and all(map(_valid_message, messages)):
        del messages[1:]  # (only when each is valid: a body that breaks the schema still does)
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            message["content"] = ""
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                part["text"] = ""


# A constraint of each kind that compiles, by the type the schema allows for it.
COMPILES = {
    ("regex", str): "[a-z]{1,4}",
    ("grammar", str): 'root ::= "yes" | "no"',
    ("json", str): '{"type": "string"}',
    ("json", dict): {"type": "string"},
    ("schema", dict): {"type": "string"},
}


def _compiling(constraint: Any, names: tuple[str, ...]) -> None:
    if isinstance(constraint, dict):
        for name in names:
            value = constraint.get(name)
            replacement = COMPILES.get((name, type(value)))
            # (An empty string is what a negative case sends to break `minLength`: kept.)
            if replacement is not None and value != "":
                constraint[name] = replacement


def _integer(value: Any) -> int | None:
    """JSON Schema's integer (3 or 3.0) as an int; None for anything else."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _valid_count(value: Any, low: int) -> bool:
    value = _integer(value)
    return value is not None and low <= value


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    _compiling(body.get("structured_outputs"), ("regex", "grammar", "json"))
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        _compiling(response_format.get("json_schema"), ("schema",))
    used = prompt_tokens_at_most(body)
    if used is None:
        return body
    if used >= MAX_MODEL_LEN - 1:
        _shorten(body)
        used = prompt_tokens_at_most(body) or 0
    room = max(1, min(MAX_NEW_TOKENS, MAX_MODEL_LEN - used))
    if "prompt" in body and "max_tokens" not in body:  # completions: 16 by default
        body["max_tokens"] = room
    if "messages" in body and body.get("max_tokens") is None:  # chat: the rest of the context
        if body.get("max_completion_tokens") is None:
            body["max_tokens"] = room
    for key in ("max_tokens", "max_completion_tokens"):  # (chat: the second wins)
        if _valid_count(body.get(key), 1):
            body[key] = min(_integer(body[key]), room)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    min_tokens = _integer(body.get("min_tokens"))
    if min_tokens is not None and min_tokens >= 0 and _valid_count(limit, 1):
        body["min_tokens"] = min(min_tokens, _integer(limit))
    return body
