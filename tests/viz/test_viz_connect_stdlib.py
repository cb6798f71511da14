"""`--connect` without httpx (issue 31, defect 6): a server that is not there yet is tried
again, a closed stream is opened again, errors are told in words, and at full speed the view
keeps up with the newest step. The server here is a stand-in on the standard library that
plays a trace as `nanovllm serve`'s `/v1/events` does (SSE `data:` lines), then hangs up.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

from test_viz_driver import Collector, start
from viz_helpers import long_trace

from nanovllm.events import EngineStarted, StepSummary, event_to_dict
from nanovllm.viz.connect import ConnectDriver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_trace(port: int, events: list) -> http.server.ThreadingHTTPServer:
    """Each GET of /v1/events gets the whole trace, then the connection closes."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b": keep-alive\n\n")
            for event in events:
                self.wfile.write(f"data: {json.dumps(event_to_dict(event))}\n\n".encode())
            self.wfile.flush()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_connect_waits_for_the_server_then_reconnects_when_it_hangs_up(trace_events):
    port = free_port()
    c = Collector()
    driver = ConnectDriver(f"http://127.0.0.1:{port}", c.publish, notify=c.notify, speed=0)
    thread = start(driver)
    # Nobody listens yet: a message in words and another try, not a traceback.
    c.wait(lambda: c.status is not None and c.status.error and "try 2" in c.status.error)
    assert "nothing listens at" in c.status.error and "trying again" in c.status.error
    server = serve_trace(port, trace_events)
    try:
        steps = sum(isinstance(e, StepSummary) for e in trace_events)
        c.wait(lambda: c.state.step == steps, timeout=30)
        # The server hung up after the trace: the driver opened the stream again.
        c.wait(lambda: driver.connections >= 2, timeout=30)
        assert any("connected" in text for text, _ in c.notices)
    finally:
        driver.stop()
        thread.join(10)
        server.shutdown()
    assert not thread.is_alive()


def test_full_speed_jumps_to_the_newest_step():
    """A backlog of 200 steps already received is drawn as its newest step, not one at a time."""
    events = long_trace(200)
    c = Collector()
    driver = ConnectDriver("http://127.0.0.1:1", c.publish, speed=0)
    driver.tape.record(events[:1])
    assert isinstance(events[0], EngineStarted)
    for event in events[1:]:
        driver._queue.put(event)
    driver._queue.put(ConnectionError("stop here"))  # then the stream ends
    driver.open_stream = lambda: None  # no server: reconnecting succeeds at once
    t0 = time.monotonic()
    driver._play()
    assert driver.state.step == 200 and driver.tape.at_end
    assert time.monotonic() - t0 < 5


def test_connect_needs_only_the_standard_library():
    """The README's install brings no httpx: the viewer must not import it."""
    import inspect

    from nanovllm.viz import connect

    assert "httpx" not in inspect.getsource(connect)
