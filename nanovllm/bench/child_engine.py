"""An engine that runs in a child process of the bench, spoken to in JSON lines.

A peer that must not share the bench's process (vLLM, from its own virtualenv; llama.cpp's
loop, with OpenMP threads of its own) runs in a child that reads one command a line on stdin
and answers one line on stdout:

    -> {"cmd": "load", ...}                    <- {"ok": true, "info": {...}}
    -> {"cmd": "run", "workload": {...}}       <- {"ok": true, "run": {...}}
    -> {"cmd": "quit"}

`ChildProcessEngine` is the parent's side of `_ask`, `run` and `close`; a subclass starts the
child in `load` (as `proc`, its stderr in the file `log`) and names it (`child_name`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from nanovllm.bench.engines import Engine, EngineUnavailable, TokenCallback
from nanovllm.bench.records import EngineRun
from nanovllm.bench.workload import Workload


class ChildProcessEngine(Engine):
    proc: subprocess.Popen | None = None
    log = ""  # (the child's stderr)
    child_name = "the child"  # (in the error raised when it exits)

    def refusal(self, error: str | None) -> str:
        """The message for a command the child refused with `error`."""
        return str(error)

    def _ask(self, cmd: dict) -> dict:
        """One JSON line to the child, one back; EngineUnavailable if it exits or refuses."""
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            tail = Path(self.log).read_text(errors="replace").strip().splitlines()[-3:]
            raise EngineUnavailable(f"{self.child_name} exited: {' | '.join(tail)} ({self.log})")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise EngineUnavailable(self.refusal(reply.get("error")))
        return reply

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        run = EngineRun.from_dict(self._ask({"cmd": "run", "workload": workload.to_dict()})["run"])
        run.engine = self.name
        if on_tokens is not None:
            on_tokens(run.num_output_tokens)
        return run

    def close(self) -> None:
        """Ask the child to quit; kill it if it does not within a minute."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None
