"""`HermesToolParser` reads outputs as vLLM 0.32's `Hermes2ProToolParser` does.

Oracle: vLLM's own parser's answers on the same texts, whole and streamed in fixed pieces
(every character, every 5, all at once), recorded by `tests/vllm_reference/record_hermes.py`
into `hermes_parser.json`: the content, the calls, and every step's delta (the call ids' shape).
The property test's expected answers are derived from vLLM's source:
`vllm/tool_parsers/hermes_tool_parser.py`,
`extract_tool_calls` (the regex `<tool_call>(.*?)</tool_call>|<tool_call>(.*)` over the whole
output, each match `json.loads`ed, arguments re-dumped with `json.dumps(ensure_ascii=False)`,
content the text before the first tag or None; any failure: no calls, the output as content)
and `extract_tool_calls_streaming` (content up to the tag with a partial tag held back; per call
a first delta with id, type and name, then the raw arguments' text as it grows).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.serve.tools import HermesToolParser

RECORDED = json.loads(
    (Path(__file__).parents[1] / "vllm_reference" / "hermes_parser.json").read_text()
)


def _id_shape(delta: dict | None) -> dict | None:
    """A delta with its call ids as their shape (they are random), as the recording has them."""
    if delta is None:
        return None
    delta = json.loads(json.dumps(delta))
    for call in delta.get("tool_calls") or []:
        if "id" in call:
            call["id"] = re.sub("[0-9a-f]", "0", call["id"].removeprefix("chatcmpl-tool-"))
            call["id"] = "chatcmpl-tool-" + call["id"]
    return delta


@pytest.mark.parametrize("case", RECORDED["cases"], ids=lambda case: case["text"][:24])
def test_texts_read_as_vllms_parser_read_them(case: dict) -> None:
    text, vllm = case["text"], case["vllm"]
    content, calls = HermesToolParser().extract_tool_calls(text)
    assert (content, bool(calls)) == (vllm["content"], vllm["tools_called"])
    assert [[c["function"]["name"], c["function"]["arguments"]] for c in calls] == vllm["calls"]
    for cuts, deltas in zip(case["cuts"], vllm["streams"], strict=True):
        parser = HermesToolParser()
        ours = [_id_shape(parser.extract_streaming(text[:end])) for end in [*cuts, len(text)]]
        assert ours == deltas, cuts


# (output, vLLM's content, vLLM's [(name, arguments)], streamed arguments' raw text per call)
CASES = [
    ("Just text, no call.", "Just text, no call.", [], []),
    (
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>",
        "Let me check.",
        [("get_weather", '{"city": "Paris"}')],
        ['{"city": "Paris"}'],
    ),
    (
        '<tool_call>{"name": "a", "arguments": {"x": [1, {"y": "}"}]}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {"s": "é"}}</tool_call>',
        None,
        [("a", '{"x": [1, {"y": "}"}]}'), ("b", '{"s": "é"}')],
        ['{"x": [1, {"y": "}"}]}', '{"s": "é"}'],
    ),
    # No closing tag: the second alternative of the regex takes the rest.
    (
        'Hi <tool_call>{"name": "f", "arguments": {}}',
        "Hi ",
        [("f", "{}")],
        ["{}"],
    ),
    # A body that is not JSON: no calls, the whole output is the content.
    ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", [], []),
]


def test_whole_outputs_as_vllm_parses_them():
    for output, content, calls, _ in CASES:
        got_content, got_calls = HermesToolParser().extract_tool_calls(output)
        assert got_content == content, output
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls
        assert all(
            c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in got_calls
        )


def _stream(output: str, cuts: list[int]) -> tuple[str, list[str], list[str], list[dict]]:
    parser = HermesToolParser()
    content, names, args, deltas = "", [], [], []
    for end in [*sorted(set(cuts)), len(output)]:
        delta = parser.extract_streaming(output[:end])
        if delta is None:
            continue
        deltas.append(delta)
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            if "name" in call["function"]:
                assert call["index"] == len(names) and call["type"] == "function"
                names.append(call["function"]["name"])
                args.append("")
            args[call["index"]] += call["function"].get("arguments", "")
    return content, names, args, deltas


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_streams_split_anywhere_give_the_same_calls(data):
    """However the output arrives, the deltas add up to vLLM's: the content before the first
    tag (never a piece of the tag), each call's name once, its arguments' raw text."""
    for output, content, calls, raw_args in CASES[:4]:
        cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=8))
        got_content, names, args, _ = _stream(output, cuts)
        assert got_content == (content or "")
        assert names == [name for name, _ in calls]
        assert args == raw_args
