"""Send the side-by-side requests to a server, and compare two servers' answers.

The requests are the `cases` of `serve_side_by_side.json` and `serve_issue60.json`: each a
method, a path (`$MODEL` stands for the served model's name, there and in the body), and a JSON
body (or raw bytes with their headers). `send` turns an answer into a comparable record: the
status, and the JSON body, or for a stream the list of its chunks (parsed) and whether it ended
with `data: [DONE]`; a case with `metrics` also records how much those `/metrics` samples grew,
one with `series` the `vllm:` sample names. `differences` compares a record with vLLM's and
lists what a client would see differ:

- the status code;
- the response's shape: its keys, null-valued ones included, the error object's, each
  choice's and its message's, usage's; the number of choices and their indices; for a stream,
  the keys of its first two chunks, of the first that finishes a choice and of the last (and
  their first choice's and delta's), the number of choices in each chunk, and each choice's
  text, finish and stop reason and tool calls;
- the text (greedy or seeded, so it is a function of the request), finish and stop reasons,
  tool calls, usage, logprob tokens (values within 1e-3), prompt logprobs' order; an error's
  `type` and `code`; /tokenize's and /detokenize's values; metric growth (a case's `metrics`
  name samples, summed over their label sets, or one label set as `name{a="x",b="y"}` less
  `model_name` and `engine`; for a stream, which of them grew); series names.

Keys vLLM sends that nanovllm does not are differences, except those in `VLLM_ONLY_KEYS`
(`metrics`, `ec_transfer_params`: features nanovllm lacks). This file imports only the standard
library and httpx, so the recorder runs it with vLLM's Python and the test with nanovllm's.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import httpx

# Keys vLLM's responses carry for features nanovllm does not have (per-request timing, the
# encoder cache's transfer); every other key vLLM sends, null-valued ones included, must be there.
VLLM_ONLY_KEYS = {"metrics", "ec_transfer_params"}
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')  # one label of a /metrics sample line


def substitute(value: Any, model: str) -> Any:
    return json.loads(json.dumps(value).replace("$MODEL", model))


def _metric_sums(client: httpx.Client) -> dict[str, float]:
    """`/metrics` as each `vllm:` sample name's value summed over its label sets, and each
    sample's own value under its name with its labels but `model_name` and `engine`
    (`name{a="x",b="y"}`, the labels sorted)."""
    sums: dict[str, float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("vllm:"):
            name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
            sums[name] = sums.get(name, 0.0) + value
            inside = line.split("{", 1)[1].rsplit("}", 1)[0] if "{" in line else ""
            labels = sorted(
                f'{k}="{v}"' for k, v in LABEL.findall(inside) if k not in ("model_name", "engine")
            )
            if labels:
                key = name + "{" + ",".join(labels) + "}"
                sums[key] = sums.get(key, 0.0) + value
    return sums


def _counted(client: httpx.Client, names: list[str], before: dict[str, float]) -> dict:
    """The named samples' growth since `before`, once two readings 0.5 s apart agree (a
    server may count a request just after answering it)."""
    last = None
    for _ in range(20):
        now = _metric_sums(client)
        deltas = {name: now.get(name, 0.0) - before.get(name, 0.0) for name in names}
        if deltas == last:
            return deltas
        last = deltas
        time.sleep(0.5)
    return last


def send(client: httpx.Client, case: dict[str, Any], model: str) -> dict[str, Any]:
    """One case's answer from the server behind `client`, as a record. A case with `metrics`
    also records how much those samples grew; one with `series`, the `vllm:` sample names."""
    headers = case.get("headers")
    path = case["path"].replace("$MODEL", model)
    before = _metric_sums(client) if case.get("metrics") else None
    if "raw" in case:
        response = client.request(
            case["method"], path, content=case["raw"].encode(), headers=headers
        )
    elif case.get("body") is not None:
        response = client.request(
            case["method"], path, json=substitute(case["body"], model), headers=headers
        )
    else:
        response = client.request(case["method"], path, headers=headers)
    record: dict[str, Any] = {"status": response.status_code}
    if case.get("series"):
        names = {line.split("{")[0].split(" ")[0] for line in response.text.splitlines()}
        record["series"] = sorted(name for name in names if name.startswith("vllm:"))
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
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
    if before is not None:
        record["metric_deltas"] = _counted(client, case["metrics"], before)
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


def _tool_calls(calls: list[dict[str, Any]] | None) -> list[tuple[Any, ...]]:
    """A message's tool calls as a client reads them (the ids are random: their shape)."""
    return [
        (
            re.sub("[0-9a-f]", "0", c.get("id", "").removeprefix("chatcmpl-tool-")),
            c.get("type"),
            c["function"]["name"],
            c["function"]["arguments"],
        )
        for c in calls or []
    ]


def _choice_diff(where: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    out = _key_diff(where, ours, theirs)
    if "message" in theirs:
        out += _key_diff(f"{where}.message", ours.get("message") or {}, theirs["message"])
        mine, vllm = (
            (ours.get("message") or {}).get("tool_calls"),
            theirs["message"].get("tool_calls"),
        )
        if _tool_calls(mine) != _tool_calls(vllm):
            out.append(f"{where}.message.tool_calls: vLLM {vllm!r}, nanovllm {mine!r}")
        if (ours.get("message") or {}).get("content") != theirs["message"]["content"]:
            out.append(
                f"{where}.message.content: vLLM {theirs['message']['content']!r}, "
                f"nanovllm {(ours.get('message') or {}).get('content')!r}"
            )
    for key in ("text", "finish_reason", "stop_reason", "logprobs", "prompt_logprobs"):
        if key in theirs and not _close(ours.get(key), theirs[key]):
            out.append(f"{where}.{key}: vLLM {theirs[key]!r}, nanovllm {ours.get(key)!r}")
    # A prompt position's entries in vLLM's order (the prompt's own token first, then by rank).
    order = lambda entries: [list(e) if e else e for e in entries or []]  # noqa: E731
    if theirs.get("prompt_logprobs") and order(ours.get("prompt_logprobs")) != order(
        theirs["prompt_logprobs"]
    ):
        out.append(f"{where}.prompt_logprobs order differs")
    return out


def _kinds(chunks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A stream's kinds of chunk: the first, the first that finishes no choice, the first that
    finishes one, the first with tool calls, the last. (Which chunk is which depends on how many steps each merged, so
    kinds are compared, not positions.)"""
    finishes = [any(x.get("finish_reason") for x in c.get("choices", [])) for c in chunks]
    kinds = {"first": chunks[:1], "going": [c for c, f in zip(chunks, finishes) if not f][:1]}
    kinds["finishing"] = [c for c, f in zip(chunks, finishes) if f][:1]
    kinds["calling"] = [
        c for c in chunks if any((x.get("delta") or {}).get("tool_calls") for x in c["choices"])
    ][:1]
    kinds["last"] = chunks[-1:]
    return {kind: found[0] for kind, found in kinds.items() if found}


def _stream_summary(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream as a client reads it: per choice index its text, finish and stop reason."""
    texts: dict[int, str] = {}
    finish: dict[int, Any] = {}
    stop: dict[int, Any] = {}
    calls: dict[int, dict[int, list[str]]] = {}  # choice -> call index -> [name, arguments]
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            i = choice["index"]
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                entry = calls.setdefault(i, {}).setdefault(call["index"], ["", ""])
                entry[0] += (call.get("function") or {}).get("name") or ""
                entry[1] += (call.get("function") or {}).get("arguments") or ""
            piece = choice.get("text")
            if piece is None:
                piece = (choice.get("delta") or {}).get("content") or ""
            texts[i] = texts.get(i, "") + piece
            if choice.get("finish_reason") is not None:
                finish[i] = choice["finish_reason"]
                stop[i] = choice.get("stop_reason")
    return {"text": texts, "finish_reason": finish, "stop_reason": stop, "tool_calls": calls}


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
        # (Not the number of chunks: both servers send the outputs of several steps in one
        # chunk when the client reads slower than the engine steps (vLLM's
        # RequestOutputCollector, nanovllm's MergedStream.drain_ready), so it depends on timing.)
        # Each kind of chunk's keys (a first chunk that also finishes a choice, on either side,
        # merged steps: the finishing kind compares it).
        mine_kinds, vllm_kinds = _kinds(ours["chunks"]), _kinds(theirs["chunks"])
        for kind in mine_kinds.keys() & vllm_kinds.keys():
            mine, vllm = mine_kinds[kind], vllm_kinds[kind]
            if kind == "first" and (
                mine is mine_kinds.get("finishing") or vllm is vllm_kinds.get("finishing")
            ):
                continue
            out += _key_diff(f"{kind} chunk", mine, vllm)
            for a, b in zip(mine.get("choices", [])[:1], vllm.get("choices", [])[:1]):
                out += _key_diff(f"{kind} chunk.choices[0]", a, b)
                out += _key_diff(
                    f"{kind} chunk.choices[0].delta", a.get("delta") or {}, b.get("delta") or {}
                )
        ours_s, theirs_s = _stream_summary(ours["chunks"]), _stream_summary(theirs["chunks"])
        for key in theirs_s:
            if ours_s[key] != theirs_s[key]:
                out.append(f"stream {key}: vLLM {theirs_s[key]!r}, nanovllm {ours_s[key]!r}")
        usage = [c["usage"] for c in theirs["chunks"] if c.get("usage")]
        if usage and [c["usage"] for c in ours["chunks"] if c.get("usage")] != usage:
            out.append("stream usage differs")
        # A stream's counts per delta depend on how many steps each merged (above): which
        # samples grew is compared, not by how much.
        grew = lambda deltas: sorted(k for k, v in (deltas or {}).items() if v)  # noqa: E731
        if "metric_deltas" in theirs:
            mine, vllm = grew(ours.get("metric_deltas")), grew(theirs["metric_deltas"])
            if mine != vllm:
                out.append(f"metrics grown: vLLM {vllm}, nanovllm {mine}")
        return out
    if "series" in theirs:
        lacking = sorted(set(theirs["series"]) - set(ours.get("series", [])))
        return [f"series only vLLM has: {lacking}"] if lacking else []
    out_metrics = []
    if "metric_deltas" in theirs and ours.get("metric_deltas") != theirs["metric_deltas"]:
        out_metrics.append(
            f"metric_deltas: vLLM {theirs['metric_deltas']}, nanovllm {ours.get('metric_deltas')}"
        )
    if "json" not in theirs:
        return [] if "json" not in ours else ["vLLM answered no JSON, nanovllm did"]
    a, b = ours.get("json"), theirs["json"]
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [] if type(a) is type(b) else [f"body: vLLM {b!r}, nanovllm {a!r}"]
    if "error" in b:
        mine = a.get("error") or {}
        out = _key_diff("error", mine, b["error"])
        for key in ("type", "code"):  # vLLM's: BadRequestError, 400
            if mine.get(key) != b["error"][key]:
                out.append(f"error.{key}: vLLM {b['error'][key]!r}, nanovllm {mine.get(key)!r}")
        return out
    out = out_metrics + _key_diff("response", a, b)
    if isinstance(b.get("usage"), dict):
        out += _key_diff("usage", a.get("usage") or {}, b["usage"])
    if "data" in b:  # /v1/models
        for i, (x, y) in enumerate(zip(a.get("data", []), b["data"])):
            out += _key_diff(f"data[{i}]", x, y)
            if x.get("id") != y.get("id") or x.get("root") != y.get("root"):
                out.append(f"data[{i}] id/root: vLLM {y.get('id')}, nanovllm {x.get('id')}")
        return out
    if "choices" not in b:  # /tokenize, /detokenize, /version: the values too
        for key in sorted(set(b) - {"version", "id", "created"}):
            if a.get(key) != b[key]:
                out.append(f"{key}: vLLM {b[key]!r}, nanovllm {a.get(key)!r}")
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
