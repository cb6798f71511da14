"""llama.cpp's batched C API, driven from Python: `llama_decode` on one batch per step.

The same peer as `engine_llamacpp.py` (llama.cpp on the very GGUF file nanovllm loads) without
its HTTP server: a build of `libllama` alone is a fraction of `llama-server`'s (which also needs
the multimodal library), and its step is the one `llama-batched-bench` times. The bindings are
`llama-cpp-python`'s own ctypes module from the sdist the build script unpacked (so they match
the library's structs exactly), loaded without the package's `__init__`, which would import its
high-level API and that API's dependencies.

Scheduling is the server's continuous batching, in `steploop.drive`'s loop: each step decodes
one token of every running sequence and fills the rest of `--max-num-batched-tokens` with
prompt chunks of requests waiting in order, each request in its own sequence of one unified KV
cache (`kv_unified`, nanovllm's KV capacity in tokens as the server's `--ctx-size`), at most
`--max-num-seqs` at once. A finished sequence's cells are freed at once
(`llama_memory_seq_rm`). Greedy: each row's argmax over llama.cpp's logits (numpy). Threads,
context and batch sizes are the server's (`server_settings`); the micro-batch (512) and the
attention kernel are llama.cpp's defaults.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections import deque
from pathlib import Path

import numpy as np

from nanovllm.bench.engine_llamacpp import bin_dir, server_settings
from nanovllm.bench.engines import Engine, EngineUnavailable, TokenCallback
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


class LlamaCppBatchedEngine(Engine):
    name = "llamacpp-batched"
    ctx = model = batch = None

    def load(self) -> dict:
        path = Path(self.model_path)
        if path.suffix != ".gguf" or not path.is_file():
            raise EngineUnavailable(f"llama.cpp runs GGUF files only; the model is {path}")
        L = self.L = bindings()
        L.llama_backend_init()
        settings = server_settings(self.limits)
        self.model = L.llama_model_load_from_file(
            str(path).encode(), L.llama_model_default_params()
        )
        if not self.model:
            raise EngineUnavailable(f"llama.cpp could not load {path}")
        params = L.llama_context_default_params()
        params.n_ctx = settings["ctx_size"]
        params.n_batch = settings["batch_size"]
        params.n_seq_max = settings["parallel"]
        params.n_threads = params.n_threads_batch = settings["threads"]
        params.kv_unified = True
        self.ctx = L.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise EngineUnavailable(f"llama.cpp could not make a context: {settings}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(settings["batch_size"], 0, 1)
        self.settings = settings
        configuration = (
            f"llama.cpp's batched C API (llama_decode) from Python, weights as stored in the "
            f"file, {settings['threads']} threads, up to {settings['parallel']} sequences "
            f"continuously batched, unified f16 KV cache of {settings['ctx_size']:,} tokens, "
            f"batch {settings['batch_size']}"
        )
        return {**settings, "configuration": configuration}

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        if not workload.greedy:
            raise EngineUnavailable("llamacpp-batched samples greedily only")
        L, reqs = self.L, workload.requests
        memory = L.llama_get_memory(self.ctx)
        L.llama_memory_clear(memory, True)
        budget, max_seqs = self.settings["batch_size"], self.settings["parallel"]
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

    def close(self) -> None:
        if self.batch is not None:
            self.L.llama_batch_free(self.batch)
        if self.ctx:
            self.L.llama_free(self.ctx)
        if self.model:
            self.L.llama_model_free(self.model)
        self.ctx = self.model = self.batch = None
