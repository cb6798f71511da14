"""ConnectDriver: animate a running `nanovllm serve` from its event stream.

`nanovllm viz --connect http://127.0.0.1:8000` loads no model. It opens the server's
`GET /v1/events` stream (server-sent events, one `nanovllm.events` event per `data:` line, see
`nanovllm/serve/event_stream.py`) and feeds every event to the same pure `reduce` the live and
replay modes use, so a learner watches real traffic from real clients: requests joining the
batch, blocks leaving and re-entering the free queue.

A reader thread turns the HTTP stream into events on a queue; each `pull` of the driver records
what has arrived (at least one engine step's worth, when the server is busy) on its tape. The
server starts every stream with `EngineStarted` and an `EngineSnapshot` of the engine at that
moment (its blocks, the free queue's order, the cached hashes, the requests), so a viewer that
connects to a busy server starts from the engine's true state, not from a fresh engine's.

The standard library's `urllib` reads the stream: `--connect` needs nothing the install does not
bring. A server that is not there yet, or that closes the stream, is tried again (after
`RETRY_SECONDS`), and the top line says why in words. Playing as fast as possible (the mode's
pace: the server sets it), the cursor jumps to the newest step recorded, so the view keeps up
with a server that steps faster than the viewer can draw.
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any

from nanovllm.events import Event, StepSummary, event_from_dict
from nanovllm.viz.driver import AddRequest, Command, Driver, Publish, Stop

WAIT_FOR_EVENTS_S = 0.25  # a tick returns after this long with no event, so the UI stays live
RETRY_SECONDS = (0.5, 1.0, 2.0, 4.0)  # waits between tries to reach the server, then the last
CONNECT_TIMEOUT_S = 10.0


class Unauthorized(ConnectionError):
    """The server wants an API key: trying again would not help."""


class Stopped(Exception):
    """The viewer quit while waiting to reach the server."""


def describe(exc: BaseException, url: str) -> str:
    """An error of the connection in words a learner can act on."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"{url} answered HTTP {exc.code}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return f"nothing listens at {url} (is `nanovllm serve` running?)"
    if isinstance(reason, socket.gaierror):
        return f"no such host in {url}"
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"{url} did not answer"
    if isinstance(reason, http.client.IncompleteRead | http.client.RemoteDisconnected):
        return "the server closed the connection"
    if isinstance(reason, ConnectionError) and str(reason):
        return str(reason)
    return f"{type(reason).__name__}: {reason}"


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
        self._response: http.client.HTTPResponse | None = None
        self._sock: socket.socket | None = None
        self.connections = 0  # streams opened so far
        self.status = replace(self.status, source=self.base_url)

    # --- the connection --------------------------------------------------------------------

    def setup(self) -> None:
        self._connect()

    def open_stream(self) -> None:
        """Open `/v1/events` once and start its reader thread; ConnectionError if it fails."""
        request = urllib.request.Request(self.events_url, headers=self.headers)
        try:
            response = urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S)  # noqa: S310
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise Unauthorized(
                    f"{self.events_url} answered HTTP 401: the server wants an API key "
                    "(--api-key KEY or $NANOVLLM_API_KEY)"
                ) from None
            raise ConnectionError(describe(exc, self.events_url)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionError(describe(exc, self.base_url)) from None
        if response.status != 200:
            raise ConnectionError(f"{self.events_url} answered HTTP {response.status}")
        # Events may be minutes apart on an idle server: no read timeout once connected.
        sock = getattr(getattr(response, "fp", None), "raw", None)
        sock = getattr(sock, "_sock", None)
        if sock is not None:
            sock.settimeout(None)
        self._sock = sock
        self._response = response
        self.connections += 1
        threading.Thread(
            target=self._read, args=(response,), name="viz-events", daemon=True
        ).start()

    def _connect(self) -> None:
        """Open the stream, trying again until it opens or the viewer quits."""
        tries = 0
        while True:
            try:
                self.open_stream()
            except Unauthorized:
                raise
            except ConnectionError as exc:
                wait = RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)]
                tries += 1
                self.status = replace(
                    self.status, error=f"{exc}; trying again in {wait:g} s (try {tries})"
                )
                self.publish()
                self._sleep_or_stop(wait)
                continue
            if self.status.error is not None:
                self.status = replace(self.status, error=None)
                self.notify_fn(f"connected to {self.base_url}", "information")
            return

    def _sleep_or_stop(self, seconds: float) -> None:
        """Wait, answering only `Stop` (raised as `Stopped`); other keys wait their turn."""
        deadline = time.monotonic() + seconds
        held: list[Command] = []
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    command = self.commands.get(timeout=left)
                except queue.Empty:
                    break
                if isinstance(command, Stop):
                    held.insert(0, command)
                    raise Stopped()
                held.append(command)
        finally:
            for command in held:
                self.commands.put(command)

    def _read(self, response: http.client.HTTPResponse) -> None:
        """The reader thread: SSE lines -> events on the queue (an exception ends the stream)."""
        try:
            for raw in response:
                if self._closing.is_set():
                    return
                line = raw.decode("utf-8").rstrip("\r\n")
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

    # --- the driver's side ---------------------------------------------------------------------

    def pull(self) -> bool:
        """Record what has arrived: one engine step's events (waiting a little for them), and
        every event already queued behind it."""
        deadline = time.monotonic() + WAIT_FOR_EVENTS_S
        events: list[Event] = []
        lost: BaseException | None = None
        while True:
            closed = any(isinstance(e, StepSummary) for e in events[-1:])
            try:
                if closed:
                    item = self._queue.get_nowait()
                else:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if isinstance(item, BaseException):
                lost = item
                break
            events.append(item)
            if isinstance(item, StepSummary):
                self.status = replace(self.status, steps=self.status.steps + 1)
        self.tape.record(events)
        if lost is not None:  # the stream ended: say why, and open a new one
            self.status = replace(self.status, error=describe(lost, self.base_url))
            self.publish()
            self._connect()
        return bool(events)

    def _forward_step(self) -> bool:
        moved = super()._forward_step()
        if not self.status.paused and self.status.speed == 0:
            self.tape.to_last_boundary()  # keep up: the newest step, not the next one
        return moved

    def handle(self, command: Command) -> None:
        if isinstance(command, AddRequest):
            threading.Thread(target=self._post, args=(command,), daemon=True).start()
        else:
            super().handle(command)

    def _post(self, command: AddRequest) -> None:
        """Typed prompts go to the server as ordinary completion requests."""
        body = {"prompt": command.prompt, "max_tokens": command.max_tokens, "temperature": 0.8}
        request = urllib.request.Request(
            self.base_url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={**self.headers, "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request) as response:  # noqa: S310
                response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.notify_fn(f"could not send the request: {describe(exc, self.base_url)}", "error")

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:  # wakes the reader thread and tells the server at once
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._response is not None:
            self._response.close()
