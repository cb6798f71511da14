"""llama.cpp's batched C API, driven from Python: `llama_decode` on one batch per step.

The same peer as `engine_llamacpp.py` (llama.cpp on the very GGUF file nanovllm loads) without
its HTTP server: a build of `libllama` alone is a fraction of `llama-server`'s (which also needs
the multimodal library), and its step is the one `llama-batched-bench` times. The bindings are
`llama-cpp-python`'s own ctypes module from the sdist the build script unpacked (so they match
the library's structs exactly), loaded without the package's `__init__`, which would import its
high-level API and that API's dependencies.

Scheduling is the server's continuous batching, in `steploop.drive`'s loop: each step decodes
one token of every running sequence and fills the rest of `--max-num-batched-tokens` with
prompt chunks of requests waiting in order, each request in its own sequence, at most
`--max-num-seqs` at once. A finished sequence's cells are freed at once
(`llama_memory_seq_rm`). Greedy: each row's argmax over llama.cpp's logits (numpy), which
llama.cpp computes only for the rows that sample (a prompt's last token, every decode).

The KV cache is llama.cpp's default layout, the one `llama-batched-bench` runs: one stream per
sequence, each as long as the workload's longest request (the context is made in `run`, for
the workload, and reused while it is big enough). A unified cache (`kv_unified`, one stream
for all sequences) makes every token attend over every cell in use, the other sequences' masked
out: at 32 sequences of 256 tokens that is 32 times the attention of one stream each, and
`llama-batched-bench -kvu` itself takes 1.74x the CPU time of its default (bench README,
llama.cpp). Threads and batch size are the server's (`server_settings`); the micro-batch (512)
and the attention kernel are llama.cpp's defaults.

The loop (`BatchedLoop`) runs in a child process, with its own OpenMP threads
(`LlamaCppBatchedEngine` says why).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types
from collections import deque
from pathlib import Path

import numpy as np

from nanovllm.bench.child_engine import ChildProcessEngine
from nanovllm.bench.engine_llamacpp import bin_dir, server_settings
from nanovllm.bench.engines import Engine, EngineLimits, EngineUnavailable, TokenCallback
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.steploop import drive
from nanovllm.bench.workload import Workload

_silent_log = None  # the C callback that drops llama.cpp's log lines; kept alive here


def bindings():
    """`llama_cpp.llama_cpp` from the unpacked sdist beside the build, on `bin_dir()`'s library."""
    if "llama_cpp.llama_cpp" in sys.modules:
        return sys.modules["llama_cpp.llama_cpp"]
    lib = bin_dir()
    found = sorted(lib.parent.parent.glob("llama_cpp_python-*/llama_cpp/llama_cpp.py"))
    if not (lib / "libllama.so").is_file() or not found:
        raise EngineUnavailable(
            f"no libllama.so in {lib} or no unpacked llama_cpp_python-* beside it; build with "
            "`python -m nanovllm.bench.tools.build_llamacpp` or set $LLAMACPP_BIN_DIR"
        )
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib)
    package = types.ModuleType("llama_cpp")  # the package without its __init__
    package.__path__ = [str(found[-1].parent)]
    sys.modules["llama_cpp"] = package
    module = importlib.import_module("llama_cpp.llama_cpp")
    # llama.cpp logs every tensor and graph it loads (hundreds of lines a model) to stderr,
    # through the bench's progress bars; the engine raises on the failures that matter.
    global _silent_log
    _silent_log = module.llama_log_callback(lambda level, text, user_data: None)
    module.llama_log_set(_silent_log, None)
    return module


def _loaded(library: str) -> bool:
    """Whether a shared library whose file name starts with `library` is mapped in here."""
    maps = Path("/proc/self/maps")
    return maps.exists() and f"/{library}" in maps.read_text()


class BatchedLoop(Engine):
    """The step loop over llama.cpp's C API, in this process (`LlamaCppBatchedEngine`'s child)."""

    name = "llamacpp-batched"
    child_name = "the llama.cpp child"
    ctx = model = batch = None
    ctx_shape = (0, 0)  # the context's (sequences, cells per sequence)
    kv_unified = False  # one KV stream for all sequences (True: llama-server's --kv-unified)

    def load(self) -> dict:
        path = Path(self.model_path)
        if path.suffix != ".gguf" or not path.is_file():
            raise EngineUnavailable(f"llama.cpp runs GGUF files only; the model is {path}")
        # (the policy below is libgomp's only if libllama is what loads libgomp here)
        libgomp_before = _loaded("libgomp")
        L = self.L = bindings()
        L.llama_backend_init()
        settings = server_settings(self.limits)
        self.model = L.llama_model_load_from_file(
            str(path).encode(), L.llama_model_default_params()
        )
        if not self.model:
            raise EngineUnavailable(f"llama.cpp could not load {path}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(settings["batch_size"], 0, 1)
        self.settings = settings
        configuration = (
            f"llama.cpp's batched C API (llama_decode) from Python, weights as stored in the "
            f"file, {settings['threads']} threads, up to {settings['parallel']} sequences "
            f"continuously batched, an f16 KV stream per sequence as long as the longest "
            f"request, batch {settings['batch_size']}"
        )
        shown = {k: v for k, v in settings.items() if k != "ctx_size"}  # (sized in `run`)
        # OpenMP's wait policy as libgomp read it when libllama loaded it (None: its default)
        policy = os.environ.get("OMP_WAIT_POLICY")
        configuration += f", OMP_WAIT_POLICY {policy or 'unset (libgomp default)'}"
        if libgomp_before:
            configuration += " (libgomp was loaded before libllama: its policy may differ)"
        return {**shown, "omp_wait_policy": policy, "configuration": configuration}

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        if not workload.greedy:
            raise EngineUnavailable("llamacpp-batched samples greedily only")
        L, reqs = self.L, workload.requests
        self.make_context(min(self.settings["parallel"], len(reqs)), workload.max_seq_len)
        memory = L.llama_get_memory(self.ctx)
        L.llama_memory_clear(memory, False)
        budget, max_seqs = self.settings["batch_size"], self.ctx_shape[0]
        waiting: deque[int] = deque()
        free_seqs = list(range(max_seqs))[::-1]
        seq_of: dict[int, int] = {}  # request -> its sequence id in the KV cache
        prefilled: dict[int, int] = {}  # request -> prompt tokens decoded so far
        generated: dict[int, list[int]] = {}  # request -> its output tokens

        def step() -> list[tuple[int, list[int]]]:
            while waiting and free_seqs:  # admit in arrival order
                i = waiting.popleft()
                seq_of[i], prefilled[i], generated[i] = free_seqs.pop(), 0, []
            rows: list[tuple[int, int, int, bool]] = []  # (request, token, position, logits)
            for i in seq_of:  # decodes first, one token each
                if prefilled[i] == len(reqs[i].prompt_token_ids):
                    pos = prefilled[i] + len(generated[i]) - 1
                    rows.append((i, generated[i][-1], pos, True))
            for i in seq_of:  # then prompt chunks, while the budget lasts
                prompt = reqs[i].prompt_token_ids
                take = min(len(prompt) - prefilled[i], budget - len(rows))
                if take <= 0:
                    continue
                start = prefilled[i]
                for k in range(start, start + take):
                    rows.append((i, prompt[k], k, k == len(prompt) - 1))
                prefilled[i] = start + take
            b = self.batch
            for n, (i, token, pos, logits) in enumerate(rows):
                b.token[n], b.pos[n], b.logits[n] = token, pos, logits
                b.n_seq_id[n], b.seq_id[n][0] = 1, seq_of[i]
            b.n_tokens = len(rows)
            if (ret := L.llama_decode(self.ctx, b)) != 0:
                raise EngineUnavailable(f"llama_decode returned {ret} on {len(rows)} tokens")
            sampled = [i for i, _, _, logits in rows if logits]
            logits = np.ctypeslib.as_array(
                L.llama_get_logits(self.ctx), (len(sampled), self.n_vocab)
            )
            produced = []
            for i, token in zip(sampled, logits.argmax(axis=1).tolist()):
                generated[i].append(token)
                produced.append((i, [token]))
                if len(generated[i]) == reqs[i].max_tokens:
                    L.llama_memory_seq_rm(memory, seq_of[i], -1, -1)
                    free_seqs.append(seq_of.pop(i))
            return produced

        start, wall, tokens, times = drive(
            [r.arrival_s for r in reqs], waiting.append, step,
            lambda: bool(waiting or seq_of), on_tokens,
        )  # fmt: skip
        records = [RequestRecord(t, s, r.arrival_s) for r, t, s in zip(reqs, tokens, times)]
        return EngineRun(self.name, wall, records)

    def make_context(self, num_seqs: int, seq_len: int) -> None:
        """A context of `num_seqs` KV streams of `seq_len` cells, unless the one held is as big.

        A new context runs one small decode before it is used (as `llama-batched-bench` does),
        so that the timed run does not pay for its first graph."""
        held_seqs, held_len = self.ctx_shape
        if self.ctx and num_seqs <= held_seqs and seq_len <= held_len:
            return
        L = self.L
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        num_seqs, seq_len = max(num_seqs, held_seqs), max(seq_len, held_len)
        params = L.llama_context_default_params()
        params.n_seq_max = num_seqs
        params.n_ctx = num_seqs * seq_len
        params.n_batch = self.settings["batch_size"]
        params.n_threads = params.n_threads_batch = self.settings["threads"]
        params.kv_unified = self.kv_unified
        self.ctx = L.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise EngineUnavailable(
                f"llama.cpp could not make a context of {num_seqs} sequences x {seq_len} "
                f"tokens: {self.settings}"
            )
        self.ctx_shape = (num_seqs, seq_len)
        b, warm = self.batch, min(16, seq_len, self.settings["batch_size"])
        for n in range(warm):  # the warm-up: a few tokens of sequence 0
            b.token[n], b.pos[n], b.logits[n] = 1, n, n == warm - 1
            b.n_seq_id[n], b.seq_id[n][0] = 1, 0
        b.n_tokens = warm
        if (ret := L.llama_decode(self.ctx, b)) != 0:
            raise EngineUnavailable(f"llama_decode returned {ret} on the warm-up batch")

    def close(self) -> None:
        if self.batch is not None:
            self.L.llama_batch_free(self.batch)
        if self.ctx:
            self.L.llama_free(self.ctx)
        if self.model:
            self.L.llama_model_free(self.model)
        self.ctx = self.model = self.batch = None


class LlamaCppBatchedEngine(ChildProcessEngine):
    """`BatchedLoop` in a child process, spoken to in JSON lines.

    llama.cpp's CPU backend runs each graph in one OpenMP parallel region and synchronizes its
    threads with `#pragma omp barrier` between operations, hundreds of times a step. In the
    bench's own process libgomp is already loaded, by torch and numba, with pools of their own
    on the same cores, and until nanovllm's thread governor replaced it `import nanovllm` set
    `OMP_WAIT_POLICY=PASSIVE` there, under which a thread at a barrier sleeps at once. So the
    loop runs in a child of its own (`main`), with libgomp's defaults as llama.cpp's tools get:

        -> {"cmd": "load", "model": PATH, "limits": {...}}   <- {"ok": true, "info": {...}}
        -> {"cmd": "run", "workload": {...}}                  <- {"ok": true, "run": {...}}
        -> {"cmd": "quit"}
    """

    name = "llamacpp-batched"

    def load(self) -> dict:
        fd, self.log = tempfile.mkstemp(prefix="nanovllm-bench-llamacpp-", suffix=".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=fd, text=True, cwd=tempfile.gettempdir(),
        )  # fmt: skip
        os.close(fd)
        limits = dataclasses.asdict(self.limits)
        return self._ask({"cmd": "load", "model": str(Path(self.model_path).resolve()),
                          "limits": limits})["info"]  # fmt: skip


def serve(lines, replies) -> None:
    """The child's side: one reply line per command line."""
    loop = None
    try:
        for line in lines:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                break
            try:
                if cmd["cmd"] == "load":
                    limits = EngineLimits(**cmd["limits"])
                    loop = BatchedLoop(cmd["model"], limits)
                    reply = {"ok": True, "info": loop.load()}
                else:
                    run = loop.run(Workload.from_dict(cmd["workload"]))
                    reply = {"ok": True, "run": run.to_dict()}
            except EngineUnavailable as exc:
                reply = {"ok": False, "error": str(exc)}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    finally:
        if loop is not None:
            loop.close()


if __name__ == "__main__":
    replies, sys.stdout = sys.stdout, sys.stderr  # (stdout carries the replies alone)
    serve(sys.stdin, replies)
