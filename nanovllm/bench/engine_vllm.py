"""vLLM itself, run by the Python of its own virtualenv, through `vllm_worker.py`.

vLLM's CPU build pins its own torch and an older transformers, so it cannot share nanovllm's
environment: it is installed apart (README.md shows how) and found through `--vllm-python`
(or `$VLLM_PYTHON`). Without it, or when vLLM fails to start, the engine is skipped and the
report says why.

The worker stays up for the whole run (loaded once, before any timing), so vLLM's repeats
interleave with the other engines' like theirs do. It gets the bench's thread count as
`OMP_NUM_THREADS` with no core binding (`VLLM_CPU_OMP_THREADS_BIND=nobind`), a KV cache of the
same bytes as nanovllm's (`kv_cache_memory_bytes`), and nanovllm's batch limits. `vllm` runs with
`enforce_eager` (no torch.compile); `vllm-compiled` is vLLM's default, inductor-compiled, which
takes minutes of warm-up on a small CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from nanovllm.bench.engines import Engine, EngineUnavailable, TokenCallback
from nanovllm.bench.records import EngineRun
from nanovllm.bench.workload import Workload

WORKER = Path(__file__).with_name("vllm_worker.py")


class VLLMEngine(Engine):
    name = "vllm"
    compiled = False
    proc: subprocess.Popen | None = None

    def load(self) -> dict:
        python = self.limits.vllm_python or os.environ.get("VLLM_PYTHON")
        if not python or not Path(python).is_file():
            where = f"{python!r} does not exist" if python else "no --vllm-python given"
            raise EngineUnavailable(
                f"{where}; vLLM's CPU build runs from its own virtualenv "
                "(see nanovllm/bench/README.md)"
            )
        lim = self.limits
        env = {
            **os.environ,
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "TOKENIZERS_PARALLELISM": "false",
        }
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes
        if lim.threads:
            env["OMP_NUM_THREADS"] = str(lim.threads)
        fd, log = tempfile.mkstemp(prefix="nanovllm-bench-vllm-", suffix=".log")
        self.log = log
        # Started in the temp directory, not the caller's: vLLM runs `python -m` subprocesses,
        # which put their working directory first on sys.path, and in a checkout of this
        # repository that directory holds `kernels/`, which would shadow Hugging Face's
        # `kernels` package that transformers imports if it finds one.
        self.proc = subprocess.Popen(
            [python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd,
            text=True, env=env, cwd=tempfile.gettempdir(),
        )  # fmt: skip
        os.close(fd)
        load = dict(
            cmd="load",
            model=str(self.folder().resolve()),  # (the worker runs elsewhere)
            enforce_eager=not self.compiled,
            kv_cache_memory_bytes=lim.kv_cache_bytes or 2**30,
            **lim.shared(),
        )
        return {**self._ask(load)["info"], "python": python, "log": log}

    def folder(self) -> Path:
        """The checkpoint folder vLLM loads: a GGUF file's weights, dequantized into one."""
        from nanovllm.bench.models import dequantized_folder
        from nanovllm.models.gguf_loader import is_gguf

        path = Path(self.model_path)
        return dequantized_folder(path) if is_gguf(path) else path

    def _ask(self, cmd: dict) -> dict:
        """One JSON line to the worker, one back."""
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            tail = Path(self.log).read_text(errors="replace").strip().splitlines()[-3:]
            raise EngineUnavailable(f"the vLLM worker exited: {' | '.join(tail)} ({self.log})")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise EngineUnavailable(f"vLLM: {reply.get('error')} (log: {self.log})")
        return reply

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
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class VLLMCompiledEngine(VLLMEngine):
    name = "vllm-compiled"
    compiled = True
