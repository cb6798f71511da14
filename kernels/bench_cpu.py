"""CPU paged attention, side by side: `python -m nanovllm.kernels.bench --cpu [--quick] [--candidates]`.

Decode attention is memory-bound: a step reads every sequence's whole K/V context once. So the
decode table reports, besides milliseconds per layer call, the effective bandwidth (bytes of K/V
that must be read / time) against what this machine can do at all, measured here as a plain large
`copy_` (bytes read + written / time; decode only reads, so the share is a yardstick, not a bound).
Prefills with cached context are compute-bound: their table reports GFLOP/s of the causal
QK^T and PV products.

To look like the engine at work, not like a loop over one cached tensor:
- every layer has its own cache (the model's number of layers), so a call finds little of its
  K/V in the CPU caches, as in a real forward pass;
- a matmul of the model's width runs before every attention call, as the projections do, so
  that handing the cores between torch's threads and the kernel's is part of the time;
- the implementations take turns within each round (the order rotates), and each figure is the
  median over rounds, with the spread shown: the machine may be shared.

Implementations: `in place (numba)` is `paged_attention_cpu`, the fast path; `gather+bmm` is the
engine's torch path before it (see `cpu_attention_candidates.py`); `reference` is the plain-torch
oracle the fast path falls back to without numba. `--candidates` adds the alternatives the fast path
was chosen over: `torch.compile` (inductor) and a C++ extension (`load_inline`; needs a compiler).
Timings are printed, never asserted.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from nanovllm.kernels.cpu_paged_attention import cpu_fast_path_available, paged_attention_cpu
from nanovllm.kernels.reference import paged_attention_ref

Impl = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Case:
    label: str
    seq_lens: tuple[int, ...]
    q_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    num_layers: int
    hidden: int  # model width, for the matmul between attention calls
    head_dim: int = 64
    block_size: int = 16

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.q_lens)


def _decodes(
    label: str, num_seqs: int, lo: int, hi: int, heads: int, kv_heads: int, layers: int, hidden: int
) -> Case:
    """num_seqs decodes with context lengths drawn uniformly from lo..hi (fixed seed)."""
    g = torch.Generator().manual_seed(num_seqs * 1000 + hi)
    lens = tuple(torch.randint(lo, hi + 1, (num_seqs,), generator=g).tolist())
    return Case(label, lens, (1,) * num_seqs, heads, kv_heads, layers, hidden)


EMBEDDED = dict(heads=4, kv_heads=2, layers=4, hidden=256)  # the model that ships in the package
SMALL_LLAMA = dict(heads=12, layers=12, hidden=768)  # a ~100M-parameter Llama

DECODE_CASES = [
    _decodes("embedded: 64 decodes, ctx 100-500", 64, 100, 500, **EMBEDDED),
    _decodes("100M kvh 4: 16 decodes, ctx 64-256", 16, 64, 256, kv_heads=4, **SMALL_LLAMA),
    _decodes("100M kvh 4: 64 decodes, ctx 64-256", 64, 64, 256, kv_heads=4, **SMALL_LLAMA),
    _decodes("100M kvh 12: 16 decodes, ctx 64-256", 16, 64, 256, kv_heads=12, **SMALL_LLAMA),
    _decodes("100M kvh 12: 64 decodes, ctx 64-256", 64, 64, 256, kv_heads=12, **SMALL_LLAMA),
]
PREFILL_CASES = [
    Case("embedded: 256-token chunk after 256 cached", (512,), (256,), 4, 2, 4, 256),
    Case("embedded: 4 fresh prefills of 128", (128,) * 4, (128,) * 4, 4, 2, 4, 256),
    Case("100M kvh 4: 512-token chunk after 512 cached", (1024,), (512,), 12, 4, 12, 768),
]


def make_layers(case: Case, seed: int = 0) -> list[tuple]:
    """One argument tuple per layer: shared metadata, a separate cache each, blocks shuffled."""
    g = torch.Generator().manual_seed(seed)
    bs, kvh, d = case.block_size, case.num_kv_heads, case.head_dim
    blocks = [-(-n // bs) for n in case.seq_lens]
    num_blocks = sum(blocks) + 1
    physical = torch.randperm(num_blocks, generator=g).to(torch.int32)
    block_tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks):
        block_tables[i, :n] = physical[used : used + n]
        used += n
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32)
    starts = torch.tensor([0, *case.q_lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    layers = []
    for _ in range(case.num_layers):
        key_cache = torch.randn(num_blocks, bs, kvh, d, generator=g)
        value_cache = torch.randn(num_blocks, bs, kvh, d, generator=g)
        query = torch.randn(int(starts[-1]), case.num_heads, d, generator=g)
        layers.append((query, key_cache, value_cache, block_tables, seq_lens, starts, d**-0.5))
    return layers


def kv_bytes(case: Case) -> int:
    """Bytes of K and V one layer call must read: every context once."""
    return 2 * sum(case.seq_lens) * case.num_kv_heads * case.head_dim * 4


def attention_flops(case: Case) -> int:
    """QK^T and PV over the keys each query token may see (causal)."""
    visible = sum(
        sum(seq_len - q_len + j + 1 for j in range(q_len))
        for seq_len, q_len in zip(case.seq_lens, case.q_lens)
    )
    return 4 * visible * case.num_heads * case.head_dim


COPY = "copy_ (256 MB)"  # the roofline's entry among the implementations of a round


def make_copy() -> Impl:
    """A plain large `copy_`, as an implementation: its time gives the machine's copy rate."""
    src = torch.ones(64 * 2**20)
    dst = torch.empty_like(src)
    return lambda *args: dst.copy_(src)


def copy_gbs(seconds: float) -> float:
    """GB/s of the 256 MB copy: bytes read + written."""
    return 2 * 64 * 2**20 * 4 / seconds / 1e9


def measure(case: Case, impls: dict[str, Impl], rounds: int) -> dict[str, list[float]]:
    """Seconds per layer call, one entry per round, for each implementation."""
    layers = make_layers(case)
    x = torch.randn(sum(case.q_lens), case.hidden)
    w = torch.randn(case.hidden, 3 * case.hidden)
    for fn in impls.values():  # warm-up: first calls compile or fill caches
        fn(*layers[0])
    times: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            total = 0.0
            for args in layers if name != COPY else layers[:1]:
                x @ w  # the projections run between attention calls
                t = time.perf_counter()
                impls[name](*args)
                total += time.perf_counter() - t
            times[name].append(total / (len(layers) if name != COPY else 1))
    return times


def max_error(case: Case, impls: dict[str, Impl]) -> dict[str, float]:
    args = make_layers(replace(case, num_layers=1))[0]
    expected = paged_attention_ref(*args)
    return {
        name: float((fn(*args) - expected).abs().max())
        for name, fn in impls.items()
        if name != COPY
    }


def _fmt_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(
            h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))
        )
    ]
    lines.append("-" * len(lines[0]))
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
        )
    return "\n".join(lines)


def _first_call(name: str, fn: Callable[[], object]) -> str:
    t = time.perf_counter()
    fn()
    return f"{name} {time.perf_counter() - t:.1f} s"


def cpu_attention_bench(quick: bool, candidates: bool) -> None:
    if not cpu_fast_path_available():
        print("numba is not installed: the fast path is the torch reference; nothing to compare")
        return
    import numba

    from nanovllm.kernels import cpu_attention_candidates as cand

    rounds = 3 if quick else 7
    decode_cases = DECODE_CASES[:1] if quick else DECODE_CASES
    prefill_cases = PREFILL_CASES[:1] if quick else PREFILL_CASES
    impls: dict[str, Impl] = {
        "in place (numba)": paged_attention_cpu,
        # The kernel's first split of the work: an item per (query tile, KV head).
        "in place, 1 KV head/item": functools.partial(paged_attention_cpu, kv_per_item=1),
        "gather+bmm": cand.gather_bmm,
        "reference": paged_attention_ref,
    }
    # First calls: the numba kernel JIT-compiles, or loads its machine code from numba's cache.
    tiny = make_layers(Case("tiny", (20,), (1,), 4, 2, 1, 256))[0]
    first = [_first_call("numba kernel", lambda: paged_attention_cpu(*tiny))]
    if candidates:
        impls["torch.compile"] = cand.inductor
        first.append(_first_call("torch.compile", lambda: cand.inductor(*tiny)))
        try:
            first.append(_first_call("C++ extension build/load", cand._cpp_module))
            impls["C++ (load_inline)"] = cand.cpp
        except Exception as e:  # no compiler, ninja or Python headers: measure the rest
            print(f"C++ candidate skipped: {type(e).__name__}: {str(e).splitlines()[0]}")

    impls[COPY] = make_copy()
    load = os.getloadavg()[0]
    print(
        f"CPU: {torch.get_num_threads()} torch threads, numba threading layer "
        f"{numba.threading_layer()}; load average {load:.1f} at the start"
    )
    print("first call in this process: " + "; ".join(first))
    print(f"float32, head_dim 64, block_size 16; median of {rounds} rounds, [min-max]\n")

    headers = ["case", "implementation", "ms", "range", "GB/s", "%copy", "vs gather", "max err"]
    rows = []
    for case in decode_cases:
        times, errors = measure(case, impls, rounds), max_error(case, impls)
        copy_rate = copy_gbs(statistics.median(times.pop(COPY)))
        rows += _table_rows(case, times, errors, kv_bytes(case) / 1e9, copy_rate)
        rows.append(["", "copy_ rate (read + write)", "", "", f"{copy_rate:.1f}", "100%", "", ""])
        print(f"  done: {case.label} ({kv_bytes(case) / 1e6:.1f} MB of K/V per layer)", flush=True)
    print("\ndecode: ms per layer call; bytes of K/V read / time, and as a share of the copy_ rate")
    print("measured in the same rounds")
    print(_fmt_table(headers, rows) + "\n")

    impls.pop(COPY)
    headers = ["case", "implementation", "ms", "range", "GFLOP/s", "vs gather", "max err"]
    rows = []
    for case in prefill_cases:
        times, errors = measure(case, impls, rounds), max_error(case, impls)
        rows += _table_rows(case, times, errors, attention_flops(case) / 1e9, None)
        print(f"  done: {case.label}", flush=True)
    print("\nprefill with cached context, and fresh prefills: ms per layer call, causal GFLOP/s")
    print(_fmt_table(headers, rows))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


def _table_rows(
    case: Case,
    times: dict[str, list[float]],
    errors: dict[str, float],
    work: float,  # GB of K/V (decode) or GFLOP (prefill) per call
    copy_rate: float | None,  # GB/s; None: no %copy column
) -> list[list[str]]:
    base = statistics.median(times["gather+bmm"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rate = [f"{work / med:.1f}"]
        if copy_rate is not None:
            rate.append(f"{work / med / copy_rate:.0%}")
        rows.append(
            [
                case.label if not rows else "",
                name,
                f"{med * 1e3:.2f}",
                f"{min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f}",
                *rate,
                f"{base / med:.2f}x",
                f"{errors[name]:.0e}",
            ]
        )
    return rows
