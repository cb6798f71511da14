"""`GET /v1/events` (also `/events`): the engine's events, live, as server-sent events.

This is how `nanovllm viz --connect URL` animates a running server: it sees exactly what an
in-process subscriber of `LLMEngine.subscribe` sees, serialized with
`nanovllm.events.event_to_dict` (rebuild them with `event_from_dict`).

Wire format (`Content-Type: text/event-stream`), one event per SSE message, each a single
`data:` line holding one JSON object whose `"kind"` names the event:

    data: {"kind": "engine_started", "model": "...", "num_kv_blocks": 512, "block_size": 16, ...}

    data: {"kind": "engine_snapshot", "step": 41, "blocks": [...], "free_queue": [...], ...}

    data: {"kind": "request_added", "request_id": "cmpl-...", "prompt": "...", ...}

    data: {"kind": "block_allocated", "request_id": "cmpl-...", "block_id": 0, ...}

    data: {"kind": "step_summary", "step": 1, "scheduled": {"cmpl-...": 7}, ...}

    : keep-alive

- The first event is always `engine_started` (the KV cache's shape and the scheduling limits),
  the second an `engine_snapshot` (`nanovllm/engine/snapshot.py`): every block's ref count and
  cached hash, the free queue from head to tail, the waiting and running requests with their
  block tables, taken in the engine thread at the moment of subscription. Then every event
  from that moment on, in the engine's order: snapshot plus events is the engine's state.
- Lines starting with `:` are SSE comments, sent every `KEEPALIVE_S` seconds while the engine
  is idle so proxies keep the connection open; SSE clients ignore them.
- The stream never ends on its own; the client closes it. A client that falls more than
  `MAX_PENDING_EVENTS` events behind gets one final
  `data: {"kind": "error", "message": "..."}` and is disconnected, so a stalled viewer
  cannot make the server buffer without bound (the engine itself never waits for viewers).
- Nothing is emitted unless someone is connected: with no listener the engine pays nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from nanovllm.events import event_to_dict
from nanovllm.serve.async_engine import MAX_PENDING_EVENTS, EventStream

KEEPALIVE_S = 15.0


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def event_sse(events: EventStream) -> AsyncIterator[str]:
    """The SSE body for one listener (from `AsyncLLMEngine.subscribe_events`).

    The caller must also `events.close()` when the response ends: a cancelled response does not
    always close its iterator at once.
    """
    try:
        while True:
            batch = await events.next_batch(timeout=KEEPALIVE_S)
            if events.overflowed:
                yield _sse(
                    {
                        "kind": "error",
                        "message": f"event listener fell more than {MAX_PENDING_EVENTS} "
                        "events behind and was disconnected",
                    }
                )
                return
            if not batch:
                yield ": keep-alive\n\n"
                continue
            yield "".join(_sse(event_to_dict(event)) for event in batch)
    finally:
        events.close()
