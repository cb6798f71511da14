"""Record vLLM's hermes tool parser's answers on fixed texts, as a test oracle.

Run with the Python of vLLM's own virtualenv (nanovllm/bench/README.md shows how to make one):

    ~/vllm-venv/bin/python tests/vllm_reference/record_hermes.py \\
        nanovllm/default_model tests/vllm_reference/hermes_parser.json

(`VLLM_HIDE_TORCHVISION=1` in front where the virtualenv's torchvision does not match its
torch, as for record_serve.py.)

For each text of the file's `cases`, vLLM 0.32's `Hermes2ProToolParser` (the parser behind
`vllm serve --tool-call-parser hermes`; the checkpoint's tokenizer given to it, as the server
gives it) reads the whole text (`extract_tool_calls`: whether it found calls, the content, each
call's name and arguments) and, for each of the case's `cuts` lists, the text as a stream that
arrives in those pieces (`extract_tool_calls_streaming`, a fresh parser per stream: each
step's delta, or null where it sends nothing). The answers are written into the case as `vllm`.
`tests/serve/test_serve_hermes_parser.py` checks that `HermesToolParser` answers the same.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def delta_record(delta: Any) -> dict[str, Any] | None:
    """A DeltaMessage as the server sends it (its set fields), the call ids as their shape."""
    if delta is None:
        return None
    record = delta.model_dump(exclude_unset=True)
    for call in record.get("tool_calls") or []:
        if call.get("id"):
            call["id"] = "chatcmpl-tool-" + "0" * (len(call["id"]) - len("chatcmpl-tool-"))
    return record


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from record_offline import hide_torchvision

    if os.environ.get("VLLM_HIDE_TORCHVISION"):
        hide_torchvision()
    import vllm
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tokenizers import get_tokenizer
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    model, path = str(Path(sys.argv[1]).resolve()), sys.argv[2]
    doc = json.loads(Path(path).read_text())
    tokenizer = get_tokenizer(model)
    request = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
    )
    for case in doc["cases"]:
        text = case["text"]
        whole = Hermes2ProToolParser(tokenizer).extract_tool_calls(text, request)
        streams = []
        for cuts in case["cuts"]:
            parser = Hermes2ProToolParser(tokenizer)
            previous, deltas = "", []
            for end in [*cuts, len(text)]:
                current = text[:end]
                delta = parser.extract_tool_calls_streaming(
                    previous, current, current[len(previous) :], [], [], [], request
                )
                deltas.append(delta_record(delta))
                previous = current
            streams.append(deltas)
        case["vllm"] = {
            "tools_called": whole.tools_called,
            "content": whole.content,
            "calls": [[c.function.name, c.function.arguments] for c in whole.tool_calls],
            "streams": streams,
        }
    doc["vllm_version"] = f"vllm {vllm.__version__}"
    Path(path).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
