"""Send the side-by-side requests to a server, and compare two servers' answers.

The requests are `serve_side_by_side.json`'s `cases`: each a method, a path, and a JSON body (or
raw bytes with their headers), with `$MODEL` standing for the served model's name. `send` turns
an answer into a comparable record: the status, and the JSON body, or for a stream the list of
its chunks (parsed) and whether it ended with `data: [DONE]`. `differences` compares a record
with vLLM's and lists what a client would see differ:

- the status code;
- the response's shape: its keys, the error object's keys, each choice's keys, the number of
  choices and their indices; for a stream, the number of choices in each chunk, the indices in
  the order they come, and the final `finish_reason` and `stop_reason` of each;
- the text (greedy or seeded, so it is a function of the request), finish and stop reasons,
  usage, logprob tokens (values within 1e-3).

Keys vLLM sends that nanovllm does not are differences, except those in `VLLM_ONLY_KEYS` (what
vLLM adds for its own features: `kv_transfer_params`, `system_fingerprint`, ...; a client reads
them as optional). This file imports only the standard library and httpx, so the recorder runs
it with vLLM's Python and the test with nanovllm's.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx

# Keys vLLM's responses carry for features nanovllm does not have; a client treats them as
# optional (OpenAI's own responses do not all have them).
VLLM_ONLY_KEYS = {
    "system_fingerprint",
    "service_tier",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
    "token_ids",
    "prompt_token_ids",
    "routed_experts",
    "prompt_tokens_details",
    "prompt_text",
    "reasoning",
    "reasoning_content",
    "tool_calls",
    "refusal",
    "annotations",
    "audio",
    "function_call",
}


def substitute(value: Any, model: str) -> Any:
    return json.loads(json.dumps(value).replace("$MODEL", model))


def send(client: httpx.Client, case: dict[str, Any], model: str) -> dict[str, Any]:
    """One case's answer from the server behind `client`, as a record."""
    headers = case.get("headers")
    if "raw" in case:
        response = client.request(
            case["method"], case["path"], content=case["raw"].encode(), headers=headers
        )
    elif case.get("body") is not None:
        response = client.request(
            case["method"], case["path"], json=substitute(case["body"], model), headers=headers
        )
    else:
        response = client.request(case["method"], case["path"], headers=headers)
    record: dict[str, Any] = {"status": response.status_code}
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        chunks, done = [], False
        for line in response.text.splitlines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
            else:
                chunks.append(json.loads(data))
        record["chunks"], record["done"] = chunks, done
    else:
        try:
            record["json"] = response.json()
        except ValueError:
            record["text"] = response.text
    # The model's path differs from machine to machine: recorded as $MODEL.
    return json.loads(json.dumps(record).replace(json.dumps(model)[1:-1], "$MODEL"))


def _keys(value: dict[str, Any]) -> set[str]:
    return set(value) - VLLM_ONLY_KEYS


def _key_diff(where: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    if _keys(ours) == _keys(theirs):
        return []
    return [
        f"{where}: keys only vLLM has {sorted(_keys(theirs) - _keys(ours))}, "
        f"only nanovllm has {sorted(_keys(ours) - _keys(theirs))}"
    ]


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, abs_tol=1e-3)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def _choice_diff(where: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    out = _key_diff(where, ours, theirs)
    if "message" in theirs:
        if (ours.get("message") or {}).get("content") != theirs["message"]["content"]:
            out.append(
                f"{where}.message.content: vLLM {theirs['message']['content']!r}, "
                f"nanovllm {(ours.get('message') or {}).get('content')!r}"
            )
    for key in ("text", "finish_reason", "stop_reason", "logprobs", "prompt_logprobs"):
        if key in theirs and not _close(ours.get(key), theirs[key]):
            out.append(f"{where}.{key}: vLLM {theirs[key]!r}, nanovllm {ours.get(key)!r}")
    return out


def _stream_summary(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream as a client reads it: per choice index its text, finish and stop reason."""
    texts: dict[int, str] = {}
    finish: dict[int, Any] = {}
    stop: dict[int, Any] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            i = choice["index"]
            piece = choice.get("text")
            if piece is None:
                piece = (choice.get("delta") or {}).get("content") or ""
            texts[i] = texts.get(i, "") + piece
            if choice.get("finish_reason") is not None:
                finish[i] = choice["finish_reason"]
                stop[i] = choice.get("stop_reason")
    return {"text": texts, "finish_reason": finish, "stop_reason": stop}


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """What a client would see differ between our record and vLLM's (empty: none)."""
    if ours["status"] != theirs["status"]:
        return [f"status: vLLM {theirs['status']}, nanovllm {ours['status']}"]
    if "chunks" in theirs:
        if "chunks" not in ours:
            return ["vLLM streamed, nanovllm did not"]
        out = []
        if ours["done"] != theirs["done"]:
            out.append(f"data: [DONE]: vLLM {theirs['done']}, nanovllm {ours['done']}")
        widths = lambda chunks: sorted({len(c.get("choices", [])) for c in chunks})  # noqa: E731
        if widths(ours["chunks"]) != widths(theirs["chunks"]):
            out.append(
                f"choices per chunk: vLLM {widths(theirs['chunks'])}, "
                f"nanovllm {widths(ours['chunks'])}"
            )
        for mine, vllm in zip(ours["chunks"][:1], theirs["chunks"][:1]):
            out += _key_diff("chunk", mine, vllm)
            for a, b in zip(mine.get("choices", [])[:1], vllm.get("choices", [])[:1]):
                out += _key_diff("chunk.choices[0]", a, b)
        ours_s, theirs_s = _stream_summary(ours["chunks"]), _stream_summary(theirs["chunks"])
        for key in theirs_s:
            if ours_s[key] != theirs_s[key]:
                out.append(f"stream {key}: vLLM {theirs_s[key]!r}, nanovllm {ours_s[key]!r}")
        usage = [c["usage"] for c in theirs["chunks"] if c.get("usage")]
        if usage and [c["usage"] for c in ours["chunks"] if c.get("usage")] != usage:
            out.append("stream usage differs")
        return out
    if "json" not in theirs:
        return [] if "json" not in ours else ["vLLM answered no JSON, nanovllm did"]
    a, b = ours.get("json"), theirs["json"]
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [] if type(a) is type(b) else [f"body: vLLM {b!r}, nanovllm {a!r}"]
    if "error" in b:
        return [] if "message" in (a.get("error") or {}) else ["no error.message"]
    out = _key_diff("response", a, b)
    if "data" in b:  # /v1/models
        for i, (x, y) in enumerate(zip(a.get("data", []), b["data"])):
            out += _key_diff(f"data[{i}]", x, y)
            if x.get("id") != y.get("id") or x.get("root") != y.get("root"):
                out.append(f"data[{i}] id/root: vLLM {y.get('id')}, nanovllm {x.get('id')}")
        return out
    if a.get("model") != b.get("model"):
        out.append(f"model: vLLM {b.get('model')!r}, nanovllm {a.get('model')!r}")
    ours_c, theirs_c = a.get("choices", []), b.get("choices", [])
    if [c.get("index") for c in ours_c] != [c.get("index") for c in theirs_c]:
        return [*out, "choice indices differ"]
    for x, y in zip(ours_c, theirs_c):
        out += _choice_diff(f"choices[{y['index']}]", x, y)
    if a.get("usage") and b.get("usage"):
        keys = ("prompt_tokens", "completion_tokens", "total_tokens")
        if any(a["usage"].get(k) != b["usage"].get(k) for k in keys):
            out.append(f"usage: vLLM {b['usage']}, nanovllm {a['usage']}")
    return out
