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
"""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


class ServerThread:
    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
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


def serve(app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
    """Serve in the foreground until Ctrl-C."""
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
