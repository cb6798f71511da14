"""What tensor parallelism's plumbing costs: `python -m nanovllm.bench.tools.tensor_parallel`.

Three measurements, each printed with the command's own numbers (nothing here is asserted):

1. Messages between 2 local gloo ranks (a spawned WorkerGroup): an all-reduce of a
   [64, 256] fp32 tensor (one row-parallel layer's output for 64 tokens of the default model),
   an all-gather of [64, 2048] (vocab-parallel logits), one step's inputs broadcast from rank 0,
   and a `WorkerGroup.run` round trip; also the group's start-up and close times.
2. Fused against separate projections at tp 1, interleaved: q/k/v as one `QKVParallelLinear`
   matmul against three `F.linear`, and gate/up as one `MergedColumnParallelLinear` against two.
3. Loading one column-parallel and one row-parallel [4096, 4096] fp32 tensor per rank from
   safetensors, by slices (`load_sharded`) against `get_tensor` of each full tensor then its
   weight loader's narrow, each in a fresh process: the bytes of the tensors or slices asked
   for, and the peak growth of the process's own (anonymous) memory and of its file-backed
   resident pages, sampled every millisecond.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.distributed.communication import (
    broadcast_tensor_dict,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from nanovllm.distributed.parallel_state import as_tp_rank, get_tp_rank
from nanovllm.distributed.worker_group import WorkerGroup


def _median_us(times: list[float]) -> float:
    return statistics.median(times) * 1e6


def _step_inputs(num_tokens: int = 64, num_seqs: int = 8) -> dict:
    """A decode-sized step's inputs, as the ModelRunner would send them."""
    return {
        "input_ids": torch.randint(0, 4096, (num_tokens,)),
        "positions": torch.arange(num_tokens),
        "slot_mapping": torch.arange(num_tokens),
        "block_tables": torch.zeros(num_seqs, 16, dtype=torch.int32),
        "context_lens": torch.full((num_seqs,), 100, dtype=torch.int32),
        "num_prefill_tokens": 0,
    }


class CommBench:
    """A rank's worker for the message timings; each method returns its per-op times."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def noop(self) -> None:
        return None

    def all_reduce(self, shape: tuple[int, ...], iters: int) -> list[float]:
        x = torch.randn(shape)
        return self._time(lambda: tensor_model_parallel_all_reduce(x), iters)

    def all_gather(self, shape: tuple[int, ...], iters: int) -> list[float]:
        x = torch.randn(shape)
        return self._time(lambda: tensor_model_parallel_all_gather(x), iters)

    def broadcast_inputs(self, iters: int) -> list[float]:
        inputs = _step_inputs() if get_tp_rank() == 0 else None
        return self._time(lambda: broadcast_tensor_dict(inputs), iters)

    def _time(self, op, iters: int) -> list[float]:
        op()  # warm up (connections, allocations)
        times = []
        for _ in range(iters):
            tensor_model_parallel_all_reduce(torch.zeros(1))  # start together
            start = time.perf_counter()
            op()
            times.append(time.perf_counter() - start)
        return times


def measure_messages(iters: int) -> None:
    start = time.perf_counter()
    group = WorkerGroup(2, CommBench, timeout_s=120)
    started = time.perf_counter() - start
    try:
        print("1. messages between 2 local gloo ranks (median of", iters, "on rank 0)")
        for label, method, args in [
            ("all-reduce [64, 256] fp32", "all_reduce", ((64, 256), iters)),
            ("all-gather [64, 2048] fp32", "all_gather", ((64, 2048), iters)),
            ("broadcast step inputs (64 tokens)", "broadcast_inputs", (iters,)),
        ]:
            times = group.run_all(method, *args)[0]
            print(f"   {label:38s} {_median_us(times):8.0f} us")
        for label, call in [
            ("WorkerGroup.run no-op", group.run),
            ("WorkerGroup.run_all no-op", group.run_all),
        ]:
            times = []
            for _ in range(iters):
                t = time.perf_counter()
                call("noop")
                times.append(time.perf_counter() - t)
            print(f"   {label:38s} {_median_us(times):8.0f} us")
    finally:
        t = time.perf_counter()
        group.close()
        closed = time.perf_counter() - t
    print(f"   group start-up {started:.2f} s, close {closed * 1e3:.0f} ms")


def measure_fusion(repeats: int) -> None:
    from nanovllm.models.linear import MergedColumnParallelLinear, QKVParallelLinear

    hidden, heads, kv_heads, head_dim, inter = 256, 4, 2, 64, 768  # the default model
    torch.manual_seed(0)
    with as_tp_rank(0, 1):
        qkv = QKVParallelLinear(hidden, head_dim, heads, kv_heads)
        gate_up = MergedColumnParallelLinear(hidden, [inter, inter])
    nn.init.normal_(qkv.weight)
    nn.init.normal_(gate_up.weight)
    q_w, k_w, v_w = qkv.weight.split([qkv.q_size, qkv.kv_size, qkv.kv_size])
    q_w, k_w, v_w = q_w.clone(), k_w.clone(), v_w.clone()
    g_w, u_w = (w.clone() for w in gate_up.weight.chunk(2))
    pairs = {
        "q/k/v": (
            lambda x: qkv(x),
            lambda x: (F.linear(x, q_w), F.linear(x, k_w), F.linear(x, v_w)),
        ),
        "gate/up": (lambda x: gate_up(x), lambda x: (F.linear(x, g_w), F.linear(x, u_w))),
    }
    print(f"2. fused vs separate projections at tp 1 (default model shapes, median of {repeats})")
    for num_tokens in (8, 512):
        x = torch.randn(num_tokens, hidden)
        for name, (fused, separate) in pairs.items():
            times = {"fused": [], "separate": []}
            for _ in range(repeats):  # interleaved, so both see the same machine load
                for key, fn in (("fused", fused), ("separate", separate)):
                    t = time.perf_counter()
                    for _ in range(20):
                        fn(x)
                    times[key].append((time.perf_counter() - t) / 20)
            f, s = _median_us(times["fused"]), _median_us(times["separate"])
            print(
                f"   {name:8s} {num_tokens:4d} tokens: fused {f:7.1f} us, separate {s:7.1f} us, separate/fused {s / f:.2f}x"
            )


class _TwoLayers(nn.Module):
    def __init__(self, size: int) -> None:
        from nanovllm.models.linear import ColumnParallelLinear, RowParallelLinear

        super().__init__()
        self.up = ColumnParallelLinear(size, size)
        self.down = RowParallelLinear(size, size)


def _rss_kb() -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["RssAnon"].split()[0]), int(fields["RssFile"].split()[0])


def _load_child(path: str, size: int, tp: int, rank: int, mode: str) -> dict:
    """In a fresh process: load one rank's shard and report what it cost."""
    from safetensors import safe_open

    from nanovllm.models.sharded_loader import load_sharded

    with as_tp_rank(rank, tp):
        model = _TwoLayers(size)
    base_anon, base_file = _rss_kb()
    peak = [base_anon, base_file]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            anon, file = _rss_kb()
            peak[0], peak[1] = max(peak[0], anon), max(peak[1], file)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    if mode == "slice":
        bytes_read = load_sharded(model, [path]).bytes_read
    else:  # ask for each full tensor, then keep this rank's slice
        bytes_read = 0
        with safe_open(path, framework="pt") as f:
            for name, param in model.named_parameters():
                full = f.get_tensor(name)
                bytes_read += full.numel() * full.element_size()
                param.weight_loader(param, full)
                del full
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return {
        "bytes_read": bytes_read,
        "peak_anon_mb": (peak[0] - base_anon) / 1024,
        "peak_file_mb": (peak[1] - base_file) / 1024,
        "seconds": seconds,
    }


def measure_loading(size: int) -> None:
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "model.safetensors")
        save_file(
            {"up.weight": torch.randn(size, size), "down.weight": torch.randn(size, size)}, path
        )
        total_mb = 2 * size * size * 4 / 2**20
        print(
            f"3. loading [{size}, {size}] column- + row-parallel fp32 ({total_mb:.0f} MB), one fresh process per row"
        )
        print("   tp rank mode   asked MB  peak anon MB  peak file-backed MB  seconds")
        for tp, rank, mode in [(1, 0, "slice"), (2, 0, "full"), (2, 0, "slice"), (2, 1, "slice")]:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "nanovllm.bench.tools.tensor_parallel",
                    "--load-child",
                    path,
                    str(size),
                    str(tp),
                    str(rank),
                    mode,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"   {tp:2d} {rank:4d} {mode:5s} {r['bytes_read'] / 2**20:9.0f} {r['peak_anon_mb']:13.0f} "
                f"{r['peak_file_mb']:20.0f} {r['seconds']:8.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--load-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_child:
        path, size, tp, rank, mode = args.load_child
        print(json.dumps(_load_child(path, int(size), int(tp), int(rank), mode)))
        return
    torch.set_num_threads(1)
    measure_messages(args.iters)
    measure_fusion(repeats=15)
    measure_loading(args.size)


if __name__ == "__main__":
    main()
