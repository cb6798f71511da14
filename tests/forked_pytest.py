"""Many short pytest runs without paying Python's start-up for each: a server that forks them.

`test_planted_bugs.py` runs a few tests against each of ~80 planted bugs, every run in a fresh
process (a bug must not leak into the next run). A fresh `python -m pytest` spends seconds on
imports before its first test: torch, transformers, hypothesis, pytest's plugins (schemathesis
among them). Those are the same for every run, so `ForkedPytest` starts one server process per
copy of the package that imports them once, then, for each run, forks itself: the child has
the imports already, runs `pytest.main` and exits; the next run forks the same clean server
again, so no run sees what another one imported or changed.

The server never imports nanovllm or the tests' conftest, since these must come from the copy
the run is pointed at. (It does import triton, through transformers' models, before the
kernels' conftest sets `TRITON_INTERPRET`: as in a plain run of a test that loads a Hugging Face
model first, and `kernels/triton_setup.py` repairs that.) It never runs a torch operation
either: a fork of a process whose OpenMP threads have started can hang in the child's first
parallel region.

Protocol, one JSON object per line: the test sends `{"args": [...], "log": path}` on the
server's stdin; the server answers `{"pid": child}` at once (so a run past its time limit can
be killed) and `{"returncode": n}` when the child is done, its output in
`log`; the child writes where its `nanovllm` comes from to `log` + ".imported".
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

SERVER = r"""
import importlib.metadata, json, os, sys

import numpy, torch, hypothesis, pytest, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer  # their modules load lazily: now
for name in ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
             "MixtralForCausalLM", "MistralForCausalLM", "PreTrainedTokenizerFast"]:
    getattr(transformers, name, None)
for plugin in importlib.metadata.entry_points(group="pytest11"):
    plugin.load()
for forbidden in ("nanovllm", "conftest"):
    assert forbidden not in sys.modules, f"the server imported {forbidden}"

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's pipe
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        import nanovllm  # (its own imports are lazy) where the run's tests will find it

        with open(job["log"] + ".imported", "w") as f:
            f.write(nanovllm.__file__)
        # The plugins were imported before pytest could rewrite their asserts: it says so.
        code = pytest.main(["-W", "ignore::pytest.PytestAssertRewriteWarning", *job["args"]])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class RunTimedOut(Exception):
    pass


class ForkedPytest:
    """A server, started in `cwd` with `env`, that runs each `run(args)` in a fork of itself."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        # cwd first on sys.path (`python -c` puts "" there): the copy, not the repository.
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self._read(timeout=300)  # {"ready": true}

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.stdout], [], [], timeout)
        if not ready:
            raise RunTimedOut(f"no answer from the pytest server in {timeout:.0f} s")
        line = self.stdout.readline()
        if not line:
            raise RuntimeError(f"the pytest server exited ({self.process.wait()})")
        return json.loads(line)

    def run(self, args: list[str], log: Path, timeout: float) -> tuple[int, str]:
        """pytest's exit code for `args` in a fork of the server, and where the fork's
        `nanovllm` is imported from (as the tests' own subprocesses, which inherit its
        environment, import it too); its output is in `log`. A run past `timeout` seconds is
        killed and raises RunTimedOut."""
        self.stdin.write(json.dumps({"args": args, "log": str(log)}) + "\n")
        self.stdin.flush()
        child = self._read(timeout=60)["pid"]
        try:
            returncode = self._read(timeout=timeout)["returncode"]
        except RunTimedOut:
            os.kill(child, signal.SIGKILL)
            self._read(timeout=60)  # the server reaps it and answers
            raise
        imported = Path(f"{log}.imported")
        return returncode, imported.read_text() if imported.exists() else "(no record)"

    def close(self) -> None:
        self.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ForkedPytest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
