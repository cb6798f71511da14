"""Run a server: `ServerThread` (uvicorn in a background thread) and `serve` (in the foreground).

`ServerThread` is how tests, notebooks and the benchmark start a real server in-process: a
real socket on loopback, the real uvicorn, so what they exercise is what a client gets. Port 0
lets the OS pick a free port (no race between finding a port and binding it); `url` tells
which one it got.

    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=path)))
    with ServerThread(build_app(engine)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        ...
    engine.shutdown()

`Server` is uvicorn's server with what an operator's supervisor (Kubernetes, systemd) expects:

- **Draining, as vLLM does.** SIGTERM (or Ctrl-C) does not stop the server at once: it drains.
  `/health` answers 503 and new generation requests are refused with a 503
  (`server_shutting_down`), so a load balancer moves traffic elsewhere, while the streams
  already running go on for up to `shutdown_timeout` seconds (`--shutdown-timeout`). A request
  that has not started (no output yet: queued) is ended at once with `server_shutting_down` (a
  503, or an error chunk and `data: [DONE]` for a stream), so its client retries elsewhere
  rather than wait out the window for nothing. A stream
  still running then is cut with an error chunk and `data: [DONE]` (a non-streamed request gets
  a 503), and the process exits 0. A second signal stops at once, as uvicorn does.
- **A dead engine ends the process.** When the engine can never step again (a tensor-parallel
  rank died), the server refuses new requests at once, waits for the engine thread to fail the
  requests in flight (it does so as it stops; `STOP_WAIT_S` at most), gives those answers
  `FLUSH_S` to go out, then exits with `ENGINE_DEAD_EXIT_CODE`, so the supervisor restarts it
  rather than leaving a server that answers 503 forever. `keep_alive_on_engine_death`
  (`--keep-alive-on-engine-death`, vLLM's VLLM_KEEP_ALIVE_ON_ENGINE_DEATH) keeps serving 503s.

Both are checked on uvicorn's own tick (every 0.1 s), on the event loop: the signal handler
only sets a flag.

- **Slow clients are timed out.** uvicorn waits for a request's headers without a bound, so a
  client sending a byte a second holds its connection (and a file descriptor) as long as it
  likes; a thousand of them hold the server. `header_protocol` bounds it: a connection whose
  request headers are not complete within `header_timeout` seconds (`--header-timeout`) of its
  opening, or of the previous response, gets a 408 and is closed. (The body's own bound is the
  guard's: guard.py.)
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

logger = logging.getLogger("nanovllm.serve")

DEFAULT_SHUTDOWN_TIMEOUT_S = 20.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
ENGINE_DEAD_EXIT_CODE = 1
# After the cut (or an engine's death), how long the last answers may take to go out.
FLUSH_S = 3.0
# After an engine's death is seen, how long its thread may take to fail the requests in flight.
STOP_WAIT_S = 10.0


class Server(uvicorn.Server):
    """uvicorn's server that drains on SIGTERM and exits when its engine died (module docstring).
    `app.state.server_state` (guard.py) and `app.state.engine`, where the app has them, are
    what it watches."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
        keep_alive_on_engine_death: bool = False,
    ) -> None:
        super().__init__(config)
        if shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {shutdown_timeout}")
        app = config.app
        self.state = getattr(app.state, "server_state", None)
        self.engine = getattr(app.state, "engine", None)
        self.shutdown_timeout = shutdown_timeout
        self.keep_alive_on_engine_death = keep_alive_on_engine_death
        self.drain_deadline: float | None = None  # set by the first signal
        self.flush_deadline: float | None = None  # set once the survivors have been cut
        self.engine_dead: str | None = None  # why the engine stopped, when that ended us
        self.dead_at = 0.0  # when the server saw it

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_deadline is not None or self.state is None or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self.start_drain(f"signal {signal.Signals(sig).name}")

    def start_drain(self, why: str) -> None:
        """Stop taking requests and let the running ones finish (thread-safe: sets flags)."""
        assert self.state is not None
        self.state.draining = True
        self.drain_deadline = time.monotonic() + self.shutdown_timeout
        logger.warning(
            "%s: draining, %d request(s) in flight get up to %g s (--shutdown-timeout)",
            why,
            self.state.in_flight,
            self.shutdown_timeout,
        )

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        now = time.monotonic()
        if self.flush_deadline is None:
            reason = self.engine.dead_reason() if self.engine is not None else None
            exits = not self.keep_alive_on_engine_death and self.drain_deadline is None
            if reason is not None and exits:
                if self.engine_dead is None:
                    logger.error("%s: exiting once the answers in flight are sent", reason)
                    self.engine_dead, self.dead_at = reason, now
                    if self.state is not None:
                        self.state.draining = True
                # The monitor may see a rank die before the engine thread has failed the
                # requests in flight (it does so as it stops): their answers' window starts then.
                if self.engine.has_stopped() or now >= self.dead_at + STOP_WAIT_S:
                    self.flush_deadline = now + FLUSH_S
            elif self.drain_deadline is not None and now >= self.drain_deadline:
                self.flush_deadline = now + FLUSH_S
        if self.drain_deadline is None and self.flush_deadline is None and self.engine_dead is None:
            return False
        if self.flush_deadline is None and self.engine_dead is None and self.engine is not None:
            from nanovllm.serve.async_engine import ServerShutdownError  # (no torch here)

            # Every tick while draining: a request that has not started (queued, or accepted
            # as the drain began) would wait out the window for nothing; its client hears now
            # (a 503, or an error chunk) and sends it to another server.
            self.engine.fail_requests(
                ServerShutdownError(
                    "the server is shutting down: the request had not started: send it to "
                    "another server"
                ),
                unstarted_only=True,
            )
        in_flight = self.state.in_flight if self.state is not None else 0
        if in_flight == 0:
            return True
        if self.flush_deadline is not None:
            if self.engine is not None and self.engine_dead is None:
                from nanovllm.serve.async_engine import ServerShutdownError  # (no torch here)

                # Every tick: a request accepted after the last cut is cut too.
                self.engine.fail_requests(
                    ServerShutdownError(
                        f"the server is shutting down: the request did not finish within "
                        f"--shutdown-timeout={self.shutdown_timeout:g} s"
                    )
                )
            return now >= self.flush_deadline
        return False


_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


def header_protocol(header_timeout: float) -> type:
    """uvicorn's h11 protocol, with a bound on the time a request's headers take to arrive."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the headers are in: the request runs (its body: guard.py)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers get the same bound

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is running
            if not self.transport.is_closing():
                self.transport.write(_REQUEST_TIMEOUT)
                self.transport.close()

    return HeaderTimeoutProtocol


class ServerThread:
    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=2,
            http=header_protocol(header_timeout),
        )
        self.server = Server(config, keep_alive_on_engine_death=True)
        self.host = host
        self.port = port
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server failed to start (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout} s")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():  # streams still open (an /events listener): cut them
            self.server.force_exit = True
            self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    app: FastAPI,
    host: str,
    port: int,
    log_level: str = "info",
    *,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    keep_alive_on_engine_death: bool = False,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
) -> int:
    """Serve in the foreground until SIGTERM or Ctrl-C (drained: `Server`). Returns the exit
    code: 0, or `ENGINE_DEAD_EXIT_CODE` when the engine died."""
    if header_timeout <= 0:
        raise ValueError(f"header_timeout must be > 0, got {header_timeout}")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=FLUSH_S,
        http=header_protocol(header_timeout),
    )
    server = Server(
        config,
        shutdown_timeout=shutdown_timeout,
        keep_alive_on_engine_death=keep_alive_on_engine_death,
    )
    server.run()
    return ENGINE_DEAD_EXIT_CODE if server.engine_dead is not None else 0
