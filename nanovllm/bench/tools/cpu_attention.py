"""CPU paged attention, side by side: `python -m nanovllm.bench.tools.cpu_attention [--quick]`.

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

Implementations: `in place (numba)` is `paged_attention_cpu`, the fast path; `C (AVX-512)`
(decode only, where `cpu_paged_attention_c` was built) is the same plan, then
`paged_attention_cpu_planned`, which sends a decode step to the C kernel; `torch path` is the
engine's plain `TorchAttention` (its decodes gathered through the block tables, then one `bmm` per
KV head), run on the metadata the engine builds (`step_metadata`); `reference` is the plain-torch
oracle the fast path falls back to without numba. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from nanovllm.kernels import cpu_paged_attention_c
from nanovllm.kernels.cpu_paged_attention import (
    cpu_fast_path_available,
    paged_attention_cpu,
    paged_attention_cpu_planned,
    plan_paged_attention_cpu,
)
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
SMOLLM2 = dict(heads=9, kv_heads=3, layers=30, hidden=576)  # SmolLM2-135M

DECODE_CASES = [
    _decodes("embedded: 64 decodes, ctx 100-500", 64, 100, 500, **EMBEDDED),
    _decodes("100M kvh 4: 16 decodes, ctx 64-256", 16, 64, 256, kv_heads=4, **SMALL_LLAMA),
    _decodes("100M kvh 4: 64 decodes, ctx 64-256", 64, 64, 256, kv_heads=4, **SMALL_LLAMA),
    _decodes("100M kvh 12: 16 decodes, ctx 64-256", 16, 64, 256, kv_heads=12, **SMALL_LLAMA),
    _decodes("100M kvh 12: 64 decodes, ctx 64-256", 64, 64, 256, kv_heads=12, **SMALL_LLAMA),
    _decodes("SmolLM2-135M: 32 decodes, ctx 150-230", 32, 150, 230, **SMOLLM2),
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


class TorchPath:
    """The engine's `TorchAttention`, called with `paged_attention_cpu`'s arguments.

    The metadata is built once per batch layout, as the engine builds it once per step (the
    layers of a case share their block tables). A call reads the new tokens' K/V back from the
    cache at their slots (one row per new token) and times the torch path's whole forward, its
    K/V write included."""

    def __init__(self) -> None:
        self._layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._metadata: object = None

    def __call__(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        from nanovllm.models.attention import TorchAttention

        layout = (block_tables, seq_lens, query_start_loc)
        if self._layout is None or any(a is not b for a, b in zip(layout, self._layout)):
            self._layout = layout
            self._metadata = self._build_metadata(*layout, key_cache.shape[1])
        meta = self._metadata
        num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
        k = key_cache.view(-1, num_kv_heads, head_dim)[meta.slot_mapping]
        v = value_cache.view(-1, num_kv_heads, head_dim)[meta.slot_mapping]
        attn = TorchAttention(query.shape[1], num_kv_heads, head_dim, scale)
        return attn.forward(query, k, v, key_cache, value_cache, meta)

    @staticmethod
    def _build_metadata(
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        block_size: int,
    ) -> object:
        from nanovllm.executor.step_inputs import step_metadata

        lens, starts = seq_lens.tolist(), query_start_loc.tolist()
        q_lens = [b - a for a, b in zip(starts, starts[1:])]
        positions = [p for n, q in zip(lens, q_lens) for p in range(n - q, n)]
        tables = [row[: -(-n // block_size)] for row, n in zip(block_tables.tolist(), lens)]
        return step_metadata(positions, q_lens, lens, tables, block_size)[1]


def c_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`paged_attention_cpu`'s work through the planned call, which sends a decode step to the C
    kernel: planned in every call, as the numba row is."""
    plan = plan_paged_attention_cpu(
        key_cache, block_tables, seq_lens, query_start_loc, query.shape[0], query.shape[1]
    )
    return paged_attention_cpu_planned(query, key_cache, value_cache, plan, scale)


C_DECODE = "C (AVX-512)"  # decode cases only
COPY = "copy_ (256 MB)"  # the roofline's entry among the implementations of a round
BASELINE = "torch path"  # what the "vs torch" column divides by


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


def cpu_attention_bench(quick: bool, case_filter: str | None = None) -> None:
    if not cpu_fast_path_available():
        print("numba is not installed: the fast path is the torch reference; nothing to compare")
        return
    import numba

    rounds = 3 if quick else 7
    decode_cases = DECODE_CASES[:1] if quick else DECODE_CASES
    prefill_cases = PREFILL_CASES[:1] if quick else PREFILL_CASES
    if case_filter is not None:  # (the cases whose label holds it, of all of them)
        decode_cases = [c for c in DECODE_CASES if case_filter in c.label]
        prefill_cases = [c for c in PREFILL_CASES if case_filter in c.label]
    impls: dict[str, Impl] = {
        "in place (numba)": paged_attention_cpu,
        **({C_DECODE: c_decode} if cpu_paged_attention_c.load() is not None else {}),
        # The kernel's first split of the work: an item per (query tile, KV head).
        "in place, 1 KV head/item": functools.partial(paged_attention_cpu, kv_per_item=1),
        BASELINE: TorchPath(),
        "reference": paged_attention_ref,
    }
    # First calls: the numba kernel JIT-compiles, or loads its machine code from numba's cache.
    tiny = make_layers(Case("tiny", (20,), (1,), 4, 2, 1, 256))[0]
    first = [_first_call("numba kernel", lambda: paged_attention_cpu(*tiny))]

    impls[COPY] = make_copy()
    load = os.getloadavg()[0]
    print(
        f"CPU: {torch.get_num_threads()} torch threads, numba threading layer "
        f"{numba.threading_layer()}; load average {load:.1f} at the start"
    )
    print("first call in this process: " + "; ".join(first))
    print(f"float32, head_dim 64, block_size 16; median of {rounds} rounds, [min-max]\n")

    headers = ["case", "implementation", "ms", "range", "GB/s", "%copy", "vs torch", "max err"]
    rows = []
    for case in decode_cases:
        times, errors = measure(case, impls, rounds), max_error(case, impls)
        copy_rate = copy_gbs(statistics.median(times.pop(COPY)))
        rows += _table_rows(case, times, errors, kv_bytes(case) / 1e9, copy_rate)
        rows.append(["", "copy_ rate (read + write)", "", "", f"{copy_rate:.1f}", "100%", "", ""])
        print(f"  done: {case.label} ({kv_bytes(case) / 1e6:.1f} MB of K/V per layer)", flush=True)
    if rows:
        print("\ndecode: ms per layer call; bytes of K/V read / time, and as a share of the copy_")
        print("rate measured in the same rounds")
        print(_fmt_table(headers, rows) + "\n")

    impls.pop(COPY)
    impls.pop(C_DECODE, None)  # (it serves decode steps only)
    headers = ["case", "implementation", "ms", "range", "GFLOP/s", "vs torch", "max err"]
    rows = []
    for case in prefill_cases:
        times, errors = measure(case, impls, rounds), max_error(case, impls)
        rows += _table_rows(case, times, errors, attention_flops(case) / 1e9, None)
        print(f"  done: {case.label}", flush=True)
    if rows:
        print(
            "\nprefill with cached context, and fresh prefills: ms per layer call, causal GFLOP/s"
        )
        print(_fmt_table(headers, rows))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


def _table_rows(
    case: Case,
    times: dict[str, list[float]],
    errors: dict[str, float],
    work: float,  # GB of K/V (decode) or GFLOP (prefill) per call
    copy_rate: float | None,  # GB/s; None: no %copy column
) -> list[list[str]]:
    base = statistics.median(times[BASELINE])
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one case of each kind, 3 rounds")
    parser.add_argument("--threads", type=int, default=None, help="torch (and kernel) threads")
    parser.add_argument(
        "--case", default=None, help="only the cases whose label holds this (e.g. SmolLM2)"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cpu_attention_bench(args.quick, args.case)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
