"""ConnectDriver: animate a running `nanovllm serve` from its event stream.

`nanovllm viz --connect http://127.0.0.1:8000` loads no model. It opens the server's
`GET /v1/events` stream (server-sent events, one `nanovllm.events` event per `data:` line, see
`nanovllm/serve/event_stream.py`) and feeds every event to the same pure `reduce` the live and
replay modes use, so a learner watches real traffic from real clients: requests joining the
batch, blocks leaving and re-entering the free queue.

A reader thread turns the HTTP stream into events on a queue; each `pull` of the driver records
one engine step's worth (everything up to the next `StepSummary`) on its tape. The server starts
every stream with `EngineStarted` and an `EngineSnapshot` of the engine at that moment (its
blocks, the free queue's order, the cached hashes, the requests), so a viewer that connects to
a busy server starts from the engine's true state, not from a fresh engine's.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import replace
from typing import Any

from nanovllm.events import Event, StepSummary, event_from_dict
from nanovllm.viz.driver import AddRequest, Command, Driver, Publish

WAIT_FOR_EVENTS_S = 0.25  # a tick returns after this long with no event, so the UI stays live


class ConnectDriver(Driver):
    mode = "connect"

    def __init__(
        self, url: str, publish: Publish, api_key: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(publish, **kwargs)
        self.base_url = url.rstrip("/")
        # A server started with --api-key wants it on /v1/events and /v1/completions too.
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.events_url = self.base_url + "/v1/events"
        self._queue: queue.Queue[Event | BaseException] = queue.Queue()
        self._closing = threading.Event()
        self._client = None
        self.status = replace(self.status, source=self.base_url)

    def setup(self) -> None:
        import httpx

        self._client = httpx.Client(timeout=httpx.Timeout(10.0, read=None))
        request = self._client.build_request("GET", self.events_url, headers=self.headers)
        try:
            response = self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"cannot reach {self.events_url}: {exc}") from exc
        if response.status_code == 401:
            raise ConnectionError(
                f"{self.events_url} answered HTTP 401: the server wants an API key "
                "(--api-key KEY or $NANOVLLM_API_KEY)"
            )
        if response.status_code != 200:
            raise ConnectionError(f"{self.events_url} answered HTTP {response.status_code}")
        self._response = response
        threading.Thread(target=self._read, name="viz-events", daemon=True).start()

    def _read(self) -> None:
        """The reader thread: SSE lines -> events on the queue (an exception ends the stream)."""
        try:
            for line in self._response.iter_lines():
                if self._closing.is_set():
                    return
                if not line.startswith("data:"):
                    continue  # blank separators and ": keep-alive" comments
                data = json.loads(line[len("data:") :])
                if data.get("kind") == "error":
                    raise ConnectionError(f"the server ended the stream: {data.get('message')}")
                self._queue.put(event_from_dict(data))
            raise ConnectionError("the server closed the event stream")
        except BaseException as exc:  # noqa: BLE001 - handed to the driver loop, shown in the UI
            if not self._closing.is_set():
                self._queue.put(exc)

    def pull(self) -> bool:
        """Record the events of one engine step (or what arrived within a short wait)."""
        deadline = time.monotonic() + WAIT_FOR_EVENTS_S
        events: list[Event] = []
        try:
            while True:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if isinstance(item, BaseException):
                    raise item
                events.append(item)
                if isinstance(item, StepSummary):
                    self.status = replace(self.status, steps=self.status.steps + 1)
                    break
        finally:
            self.tape.record(events)
        return bool(events)

    def handle(self, command: Command) -> None:
        if isinstance(command, AddRequest):
            threading.Thread(target=self._post, args=(command,), daemon=True).start()
        else:
            super().handle(command)

    def _post(self, command: AddRequest) -> None:
        """Typed prompts go to the server as ordinary completion requests."""
        import httpx

        try:
            httpx.post(
                self.base_url + "/v1/completions",
                json={
                    "prompt": command.prompt,
                    "max_tokens": command.max_tokens,
                    "temperature": 0.8,
                },
                headers=self.headers,
                timeout=None,
            )
        except httpx.HTTPError as exc:
            self.notify_fn(f"could not send the request: {exc}", "error")

    def close(self) -> None:
        self._closing.set()
        if self._client is not None:
            self._client.close()
