"""`nanovllm serve` processes pinned to CPU cores, for benches that load servers over HTTP.

Each server is a subprocess in a session (process group) of its own, pinned to its cores
(`os.sched_setaffinity` in the child, before `exec`: every thread it starts inherits them) and
given as many torch and numba threads as it has cores (`OMP_NUM_THREADS`, `NUMBA_NUM_THREADS`:
`nanovllm serve` has no thread flag, and torch reads the first at start-up). Its output goes to
a log file (in a temporary folder, left after the run), whose tail is quoted when it fails to
start.

`ServerGroup` is a context manager: on leaving it, however it is left, every process it
started is sent SIGTERM (its whole process group), given `grace_s` seconds, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A TCP port no one listens on now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path
    cores: tuple[int, ...] | None  # None: not pinned

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


class ServerGroup:
    """Servers started together and all stopped together (module docstring)."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.servers: list[Server] = []
        self.grace_s = grace_s
        self.log_dir = Path(tempfile.mkdtemp(prefix="nanovllm-bench-servers-"))

    def __enter__(self) -> ServerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(
        self, name: str, args: Sequence[str], cores: Sequence[int] | None, port: int | None = None
    ) -> Server:
        """`nanovllm serve ARGS --port P` (P free unless given), pinned to `cores` with one
        torch thread per core (None: not pinned, threads left to torch)."""
        port = port or free_port()
        command = [sys.executable, "-m", "nanovllm", "serve", *args, "--port", str(port)]
        return self.launch(name, command, f"http://127.0.0.1:{port}", cores)

    def launch(
        self, name: str, command: Sequence[str], url: str, cores: Sequence[int] | None
    ) -> Server:
        """Any command, as `start` runs a server: pinned, its threads set, logged, stopped
        with the group."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        pinned = tuple(cores) if cores is not None else None
        if pinned is not None:
            env["OMP_NUM_THREADS"] = env["NUMBA_NUM_THREADS"] = str(len(pinned))

        def pin() -> None:  # runs in the child between fork and exec
            if pinned is not None:
                os.sched_setaffinity(0, pinned)

        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                list(command),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=pin,
                start_new_session=True,  # its own process group: stopped with all its children
            )
        server = Server(name, url, process, log, pinned)
        self.servers.append(server)
        return server

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until every server answers GET /health with 200; RuntimeError (with the log's tail)
        when one exits first or the time runs out."""
        deadline = time.monotonic() + timeout_s
        waiting = list(self.servers)
        while waiting:
            for server in list(waiting):
                if server.process.poll() is not None:
                    raise RuntimeError(
                        f"{server.name} exited with {server.process.returncode} before it was "
                        f"ready; its log ({server.log}):\n{server.log_tail()}"
                    )
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(server.url + "/health", timeout=2) as response:
                        if response.status == 200:
                            waiting.remove(server)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(s.name for s in waiting)
                raise RuntimeError(f"{names} not ready after {timeout_s:.0f} s")
            if waiting:
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to every server's process group, SIGKILL to those still alive `grace_s`
        seconds later; waits for all of them."""
        for server in self.servers:
            _signal_group(server.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for server in self.servers:
            try:
                server.process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                _signal_group(server.process, signal.SIGKILL)
                server.process.wait()
        self.servers.clear()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)  # the group `start_new_session` made: this server's own
