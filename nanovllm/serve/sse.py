"""Server-sent events: the framing of every stream the server sends, and its cleanup.

An SSE stream is plain text: each message is `data: <one line>` followed by a blank line.
OpenAI's streams send one JSON chunk per message and end with `data: [DONE]`.

`ClosingStreamingResponse` runs a callback however the response ends: finished, failed, or
cancelled because the client disconnected. That callback is what aborts a generation whose
reader has gone, at once. (An async generator's own `finally` is not enough: when the response
task is cancelled while the generator waits at a `yield`, the generator is only closed later,
by the garbage collector.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = "data: [DONE]\n\n"

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ClosingStreamingResponse(StreamingResponse):
    def __init__(self, content: AsyncIterable[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
