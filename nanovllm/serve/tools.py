"""Tool calling in chat, as vLLM does it: the tools in the prompt, and calls out of the output.

A chat request may carry `tools` (functions the model may call, each with a JSON Schema of its
arguments) and `tool_choice`:

- the tools are rendered into the prompt by the chat template (a template that takes `tools`
  lays them out in the model's own format; one that does not ignores them);
- `tool_choice: "none"`: the model answers in text; its output is the message's content;
- `"required"` and a named function (`{"type": "function", "function": {"name": "f"}}`): the
  output is constrained, through the structured-output path, to a JSON array of calls (each
  `{"name": ..., "parameters": {...}}`, the schema `required_calls_schema` builds) or to the named
  function's arguments, so it always parses into `tool_calls`;
- `"auto"` (the default when tools are given): the model decides; with the server's
  `--enable-auto-tool-choice --tool-call-parser hermes`, a `<tool_call>{...}</tool_call>` in the
  output becomes a tool call (`HermesToolParser`), the text before it the content. Without those
  flags "auto" is a 400, as in vLLM.

`HermesToolParser` follows vLLM 0.32's `Hermes2ProToolParser` (`vllm/tool_parsers/
hermes_tool_parser.py`): the same regular expression for whole outputs, and for streams the same
deltas: content up to a `<tool_call>` tag (a partial tag held back), then per call one delta with
its `id`, `type` and `name`, then the arguments' text as it grows.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TOOL_CALL_PARSERS = ("hermes",)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """One entry of a request's `tools`: a function the model may call."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice` naming one function: the model must call it."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def make_tool_call_id() -> str:
    """vLLM's: `chatcmpl-tool-` and 16 hex digits (64 random bits)."""
    return f"chatcmpl-tool-{uuid.uuid4().int & (1 << 64) - 1:016x}"


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """A response message's tool call (OpenAI's shape; the arguments as JSON text)."""
    return {
        "id": make_tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def required_calls_schema(tools: list[Tool]) -> dict[str, Any]:
    """`tool_choice: "required"`: a JSON array of one or more calls of the given functions
    (vLLM's `_get_json_schema_from_tools`)."""

    def one(tool: Tool) -> dict[str, Any]:
        parameters = tool.function.parameters or {"type": "object", "properties": {}}
        return {
            "properties": {
                "name": {"type": "string", "enum": [tool.function.name]},
                "parameters": parameters,
            },
            "required": ["name", "parameters"],
        }

    return {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": [one(t) for t in tools]},
    }


def named_function(tools: list[Tool], name: str) -> Tool:
    for tool in tools:
        if tool.function.name == name:
            return tool
    raise ValueError(f"tool_choice: tool {name!r} has not been passed in `tools`")


def required_tool_calls(output: str) -> list[dict[str, Any]]:
    """The calls of a `"required"` output (a JSON array the constraint made it)."""
    return [
        tool_call(call["name"], json.dumps(call["parameters"], ensure_ascii=False))
        for call in json.loads(output)
    ]


def partial_tag_overlap(text: str, tag: str) -> int:
    """How many characters at the end of `text` are the start of `tag` (0 when none)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def _is_complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class HermesToolParser:
    """Hermes-format tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`):
    whole outputs (`extract_tool_calls`) and streams (`extract_streaming`, called with the text
    so far after every step). One parser per choice of a streamed request (it keeps what was
    sent)."""

    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    tool_call_regex = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def __init__(self) -> None:
        self._sent_content = 0  # characters of content sent
        self._names: list[str] = []  # names sent, per call
        self._args_sent: list[str] = []  # arguments' text sent, per call

    @property
    def tools_called(self) -> bool:
        return bool(self._names)

    def extract_tool_calls(self, output: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool calls) of a whole output; with no call, or one that does not parse,
        the output is the content and there are no calls (as vLLM's parser answers)."""
        if self.start_tag not in output:
            return output, []
        try:
            calls = [
                json.loads(whole or tail) for whole, tail in self.tool_call_regex.findall(output)
            ]
            tool_calls = [
                tool_call(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls
            ]
        except (ValueError, KeyError, TypeError):
            return output, []
        content = output[: output.find(self.start_tag)]
        return content or None, tool_calls

    def extract_streaming(self, text: str) -> dict[str, Any] | None:
        """The delta message for the text so far (content not yet sent, and tool-call deltas),
        or None when there is nothing new to send."""
        content = self._new_content(text)
        deltas: list[dict[str, Any]] = []
        for i, (body, complete) in enumerate(self._call_bodies(text)):
            if i == len(self._names):
                match = re.search(r'"name"\s*:\s*"([^"]+)"', body)
                if not match:
                    break  # the next call's name is not complete yet
                self._names.append(match.group(1))
                self._args_sent.append("")
                deltas.append(
                    {
                        "index": i,
                        "id": make_tool_call_id(),
                        "type": "function",
                        "function": {"name": match.group(1)},
                    }
                )
            args = _arguments_text(body, complete)
            if args is not None and len(args) > len(self._args_sent[i]):
                deltas.append(
                    {"index": i, "function": {"arguments": args[len(self._args_sent[i]) :]}}
                )
                self._args_sent[i] = args
        if content or deltas:
            # vLLM's delta with calls has `content` null when no text came with them.
            delta: dict[str, Any] = {"content": content or None} if deltas else {"content": content}
            if deltas:
                delta["tool_calls"] = deltas
            return delta
        return None

    def _new_content(self, text: str) -> str | None:
        if self.start_tag in text:
            end = text.index(self.start_tag)
        else:
            end = len(text) - partial_tag_overlap(text, self.start_tag)
        if end > self._sent_content:
            content = text[self._sent_content : end]
            self._sent_content = end
            return content
        return None

    def _call_bodies(self, text: str) -> list[tuple[str, bool]]:
        """Each `<tool_call>` region's JSON text, and whether it is complete."""
        bodies = []
        pos = 0
        while (start := text.find(self.start_tag, pos)) != -1:
            begin = start + len(self.start_tag)
            end = text.find(self.end_tag, begin)
            if end != -1:
                bodies.append((text[begin:end].strip(), True))
                pos = end + len(self.end_tag)
                continue
            raw = text[begin:]
            overlap = partial_tag_overlap(raw, self.end_tag)
            body = (raw[:-overlap] if overlap else raw).strip()
            bodies.append((body, bool(body) and _is_complete_json(body)))
            break
        return bodies


def _arguments_text(body: str, complete: bool) -> str | None:
    """The text of a call's `"arguments"` value: up to its matching bracket (strings skipped),
    or as far as it has come."""
    match = re.search(r'"arguments"\s*:\s*', body)
    if not match:
        return None
    raw = body[match.end() :]
    if not raw or raw[0] not in "{[":
        if complete:
            raw = raw.rstrip()
            if raw.endswith("}"):
                raw = raw[:-1].rstrip()
        return raw
    open_ch, close_ch = raw[0], "}" if raw[0] == "{" else "]"
    depth, in_string, escaped = 0, False, False
    for i, c in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return raw[: i + 1]
    return raw
