"""vLLM itself, run by the Python of its own virtualenv, through `vllm_worker.py`.

vLLM's CPU build pins its own torch and an older transformers, so it cannot share nanovllm's
environment: it is installed apart (README.md shows how) and found through `--vllm-python`
(or `$VLLM_PYTHON`). Without it, or when vLLM fails to start, the engine is skipped and the
report says why.

The worker stays up for the whole run (loaded once, before any timing), so vLLM's repeats
interleave with the other engines' like theirs do. Each row runs vLLM in a configuration its CPU
documentation gives (docs/getting_started/installation/cpu.md, "Related runtime environment
variables"), named beside its figures:

    vllm           its own thread binding (`VLLM_CPU_OMP_THREADS_BIND=auto`: one OpenMP thread
                   pinned to each core) with every core computing
                   (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`): the docs' advice for a machine that
                   serves nothing else (the fastest on a quiet machine; on a loaded one see the README)
    vllm-default   vLLM as installed: the same binding, one core kept back for its scheduler
                   process (on x86, one per rank) and the rest computing
    vllm-compiled  `vllm` with vLLM's default torch.compile instead of `enforce_eager`
                   (minutes of warm-up on a small CPU)

With `--threads N` below the machine's cores, the binding is cores 0..N-1
(`VLLM_CPU_OMP_THREADS_BIND=0-{N-1}`) instead of every core. Every row gets a KV cache of the
same bytes as nanovllm's (`kv_cache_memory_bytes`, what `VLLM_CPU_KVCACHE_SPACE` sets in whole
GiB) and nanovllm's batch limits, and reports the preemptions vLLM counted in each run
(`vllm:num_preemptions`).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from nanovllm.bench.child_engine import ChildProcessEngine
from nanovllm.bench.engines import EngineUnavailable

WORKER = Path(__file__).with_name("vllm_worker.py")


class VLLMEngine(ChildProcessEngine):
    name = "vllm"
    child_name = "the vLLM worker"
    compiled = False
    reserved_cpus: int | None = 0  # VLLM_CPU_NUM_OF_RESERVED_CPU; None: vLLM's default

    def environment(self) -> dict[str, str]:
        """The variables this row sets for vLLM (the rest of the bench's environment goes with
        them, less any VLLM_CPU_* variable of the caller's)."""
        env = {}
        threads, cores = self.limits.threads, os.cpu_count() or 1
        if threads and threads < cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
        if self.reserved_cpus is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(self.reserved_cpus)
        return env

    def configuration(self, kv_cache_memory_bytes: int) -> str:
        """This row's configuration in words, for the report."""
        env = self.environment()
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        reserved = env.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "default: 1")
        lim = self.limits
        return (
            f"VLLM_CPU_OMP_THREADS_BIND={bind}, VLLM_CPU_NUM_OF_RESERVED_CPU={reserved}, "
            f"{'torch.compile' if self.compiled else 'enforce_eager'}, KV "
            f"{kv_cache_memory_bytes / 2**20:,.0f} MiB, max_num_seqs {lim.max_num_seqs}, "
            f"max_num_batched_tokens {lim.max_num_batched_tokens}"
        )

    def load(self) -> dict:
        python = self.limits.vllm_python or os.environ.get("VLLM_PYTHON")
        if not python or not Path(python).is_file():
            where = f"{python!r} does not exist" if python else "no --vllm-python given"
            raise EngineUnavailable(
                f"{where}; vLLM's CPU build runs from its own virtualenv "
                "(see nanovllm/bench/README.md)"
            )
        lim = self.limits
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_CPU_")}
        env.pop("OMP_NUM_THREADS", None)  # (vLLM's binding sets it per worker)
        env.update(self.environment(), TOKENIZERS_PARALLELISM="false")
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
        kv_cache_memory_bytes = lim.kv_cache_bytes or 2**30
        load = dict(
            cmd="load",
            model=str(self.folder().resolve()),  # (the worker runs elsewhere)
            enforce_eager=not self.compiled,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            **lim.shared(),
        )
        info = self._ask(load)["info"]
        configuration = self.configuration(kv_cache_memory_bytes)
        return {**info, "configuration": configuration, "python": python, "log": log}

    def folder(self) -> Path:
        """The checkpoint folder vLLM loads: a GGUF file's weights, dequantized into one."""
        from nanovllm.bench.models import dequantized_folder
        from nanovllm.models.gguf_loader import is_gguf

        path = Path(self.model_path)
        return dequantized_folder(path) if is_gguf(path) else path

    def refusal(self, error: str | None) -> str:
        return f"vLLM: {error} (log: {self.log})"


class VLLMDefaultEngine(VLLMEngine):
    name = "vllm-default"
    reserved_cpus = None


class VLLMCompiledEngine(VLLMEngine):
    name = "vllm-compiled"
    compiled = True
