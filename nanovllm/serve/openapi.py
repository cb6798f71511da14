"""The OpenAPI schema (/openapi.json) as the server really checks requests.

FastAPI writes the schema from the request models (`protocol.py`), which state every bound that
does not depend on the model served: types (strict), ranges, lengths, and the cross-field rules
JSON Schema can state (`echo` with `logprobs`, `top_logprobs` without `logprobs`,
`prompt_logprobs` with `stream`, `response_format` with `structured_outputs`). This file adds
what only the running server knows:

- token ids (`prompt` as ids, `stop_token_ids`, `allowed_token_ids`, `logit_bias` keys) are
  below the vocabulary size;
- a prompt of ids is shorter than `max_model_len` (and `max_tokens` is described with it: its
  bound depends on the prompt's length, so it is not a `maximum`);
- `model` is the one model served (another name is a 404);
- every array holds at most `MAX_JSON_ITEMS` entries (the guard's bound on any array or object
  in a body, `body.py`);
- with an API key, every guarded route (guard.py) declares the bearer scheme and its 401.

What JSON Schema cannot state stays a 400 naming the field, and is written in the field's
description: a prompt plus `max_tokens` must fit `max_model_len` (counted in tokens), a text
prompt must fit at all, `min_tokens` is at most `max_tokens`, and a structured-output
constraint must compile (`structured_output/`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from nanovllm.serve.body import MAX_JSON_ITEMS
from nanovllm.serve.guard import needs_api_key

GENERATION_SCHEMAS = ("CompletionRequest", "ChatCompletionRequest")
_UNAUTHORIZED = {
    "description": "Missing or wrong API key",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
}


def decimal_below(n: int) -> str:
    """A regex matching exactly the canonical decimal strings of 0 .. n - 1 (n >= 1).

    For n = 320: "0"; one digit or two ("[1-9]", "[1-9][0-9]"); three digits below 319
    ("[1-2][0-9][0-9]", "30[0-9]", "31[0-8]"); and "319"."""
    top = str(n - 1)
    parts = ["0"]
    for width in range(1, len(top)):  # every number with fewer digits than n - 1
        parts.append("[1-9]" + "[0-9]" * (width - 1))
    for i, digit in enumerate(top):  # as many digits: top's first i, then a smaller digit
        low = 1 if i == 0 else 0
        if int(digit) > low:
            parts.append(f"{top[:i]}[{low}-{int(digit) - 1}]" + "[0-9]" * (len(top) - i - 1))
    parts.append(top)
    return "^(" + "|".join(dict.fromkeys(parts)) + ")$"


def describe_server(app: FastAPI, *, model_name: str | list[str], max_model_len: int, vocab_size: int,
                    api_key: bool) -> None:  # fmt: skip
    """Make `app.openapi()` return the schema with this server's own bounds (above)."""
    make_schema = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = make_schema()
            _bound(schema, model_name, max_model_len, vocab_size)
            if api_key:
                _guard(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _bound(schema: dict, model_name: str | list[str], max_model_len: int, vocab_size: int) -> None:
    names = [model_name] if isinstance(model_name, str) else list(model_name)
    schemas = schema["components"]["schemas"]
    for name in GENERATION_SCHEMAS:
        properties = schemas[name]["properties"]
        for field in ("max_tokens", "max_completion_tokens"):
            if field in properties:
                properties[field]["description"] = (
                    f"with the prompt's tokens, at most max_model_len = {max_model_len}"
                )
        properties["model"] = {
            "anyOf": [{"type": "string", "enum": names}, {"type": "null"}],
            "default": None,
            "description": "the model served (another name is a 404)",
        }
        for branch in _branches(properties.get("logit_bias", {})):
            if branch.get("type") == "object":
                branch["propertyNames"] = {"pattern": decimal_below(vocab_size)}
                branch["maxProperties"] = vocab_size
        properties.get("logit_bias", {}).pop("propertyNames", None)
        for branch in _branches(properties.get("truncate_prompt_tokens", {})):
            if branch.get("type") == "integer":  # -1, or 1 .. max_model_len (0 is refused)
                branch["maximum"] = max_model_len
                branch["not"] = {"const": 0}
        for field, value in properties.items():
            _bound_token_ids(value, vocab_size, max_model_len - 1 if field == "prompt" else None)
    if "DetokenizeRequest" in schemas:  # its ids below the vocabulary size, as generation's
        _bound_token_ids(schemas["DetokenizeRequest"], vocab_size)
    # The guard's bound on any array or object (`body.py`), on every request schema's arrays.
    for component in schemas.values():
        _bound_items(component)


def _bound_items(node: Any) -> None:
    """At most MAX_JSON_ITEMS entries in every array the schema declares."""
    if isinstance(node, dict):
        if node.get("type") == "array":
            node["maxItems"] = min(node.get("maxItems", MAX_JSON_ITEMS), MAX_JSON_ITEMS)
        for value in node.values():
            _bound_items(value)
    elif isinstance(node, list):
        for value in node:
            _bound_items(value)


def _bound_token_ids(node: Any, vocab_size: int, max_len: int | None = None) -> None:
    """Every token id (an integer with minimum 0, in an array) below the vocabulary size; with
    `max_len`, at most that many in a list (a prompt's)."""
    if isinstance(node, dict):
        items = node.get("items")
        if node.get("type") == "array" and isinstance(items, dict):
            if items.get("type") == "integer" and items.get("minimum") == 0:
                items["maximum"] = vocab_size - 1
                if max_len is not None:
                    node["maxItems"] = min(node.get("maxItems", max_len), max_len)
        for value in node.values():
            _bound_token_ids(value, vocab_size, max_len)
    elif isinstance(node, list):
        for value in node:
            _bound_token_ids(value, vocab_size, max_len)


def _branches(node: dict) -> list[dict]:
    return node.get("anyOf", [node])


def _guard(schema: dict) -> None:
    """The bearer scheme on every route the guard holds, each with its 401."""
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "the server's --api-key (or $NANOVLLM_API_KEY)",
    }
    for path, operations in schema["paths"].items():
        if not needs_api_key(path):
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}]
            operation.setdefault("responses", {}).setdefault("401", _UNAUTHORIZED)
