"""The Triton kernels timed: `python -m nanovllm.bench.tools.triton_kernels [--quick]`.

(The numba CPU attention kernel has its own: `python -m nanovllm.bench.tools.cpu_attention`.)

On a GPU (kernels compiled) it answers the two questions that matter for attention kernels:

- decode is memory-bound: every step reads the whole K/V context once, so the figure of merit is
  bandwidth, bytes of K/V read per second, set against what the device can do at all, measured
  here as the bandwidth of a large device-to-device `torch` copy;
- against torch's own `scaled_dot_product_attention` on the same data laid out contiguously (the
  layout a paged cache gives up), how much time does paging plus our kernel cost or save?

Prefill is compute-bound, so its table also shows TFLOP/s. store_kvcache is a pure copy and is
measured as bandwidth only.

On a CPU the kernels run in Triton's interpreter, thousands of times slower than compiled code, so
the CPU table only shows interpreter vs plain-torch reference times on tiny shapes: a sanity check
that everything runs, not a performance number. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanovllm.kernels import triton_setup
from nanovllm.kernels.reference import paged_attention_ref, store_kvcache_ref


@dataclass
class Paged:
    """A batch in the paged layout plus the same context gathered contiguously (for SDPA)."""

    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    scale: float
    max_query_len: int

    def args(self) -> tuple:
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            self.scale,
        )

    def kv_bytes(self) -> int:
        """Bytes of K and V the attention must read: every sequence's whole context, once."""
        _, _, kvh, d = self.key_cache.shape
        return 2 * int(self.seq_lens.sum()) * kvh * d * self.key_cache.element_size()


def make_paged(
    num_seqs: int,
    context: int,
    q_len: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
) -> Paged:
    """Equal-length sequences whose blocks are scattered over the cache in random order."""
    blocks_per_seq = -(-context // block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, dtype=dtype, device=device)
    value_cache = torch.randn(shape, dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, device=device).to(torch.int32)
    block_tables = perm.view(num_seqs, blocks_per_seq)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device=device)
    query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=device) * q_len
    query = torch.randn(
        num_seqs * q_len, num_kv_heads * group, head_dim, dtype=dtype, device=device
    )
    return Paged(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        head_dim**-0.5,
        q_len,
    )


def contiguous_sdpa_inputs(p: Paged) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, H, q_len, d], k/v [B, KVH, context, d]: the batch as SDPA wants it (equal lengths)."""
    num_seqs, context = p.block_tables.shape[0], int(p.seq_lens[0])
    _, block_size, kvh, d = p.key_cache.shape
    k = p.key_cache[p.block_tables.long()].reshape(num_seqs, -1, kvh, d)[:, :context]
    v = p.value_cache[p.block_tables.long()].reshape(num_seqs, -1, kvh, d)[:, :context]
    q = p.query.view(num_seqs, p.max_query_len, -1, d)
    return (
        q.transpose(1, 2).contiguous(),
        k.transpose(1, 2).contiguous(),
        v.transpose(1, 2).contiguous(),
    )


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal SDPA with GQA; queries are the last q_len positions of the context."""
    q_len, context = q.shape[2], k.shape[2]
    causal = q_len == context
    mask = None
    if not causal and q_len > 1:  # chunked: shift the causal diagonal by the cached prefix
        mask = torch.ones(q_len, context, dtype=torch.bool, device=q.device).tril(context - q_len)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
    )


def _fmt_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(
        h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths))
    )
    out = [line, "-" * len(line)]
    for r in rows:
        out.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# GPU: compiled kernels.
# ---------------------------------------------------------------------------------------------


def gpu_bench(quick: bool) -> None:
    import triton.testing

    from nanovllm.kernels.paged_attention import paged_attention
    from nanovllm.kernels.paged_attention_naive import paged_attention_naive
    from nanovllm.kernels.store_kvcache import store_kvcache

    def bench(fn: Callable[[], object]) -> float:  # median milliseconds
        return triton.testing.do_bench(fn, warmup=10 if quick else 25, rep=30 if quick else 100)

    dev = "cuda"
    name = torch.cuda.get_device_name()
    src = torch.empty(512 * 2**20, dtype=torch.uint8, device=dev)  # 512 MiB, far beyond L2
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() / copy_ms / 1e6  # read + write
    print(f"device: {name}; torch copy bandwidth (read + write): {copy_gbs:,.0f} GB/s\n")

    # Llama-3-8B-like attention: 32 query heads, 8 kv heads, head_dim 128, bf16, block size 16.
    kvh, group, d, bs, dtype = 8, 4, 128, 16, torch.bfloat16
    decode_cases = [(1, 4096), (8, 4096), (64, 2048), (256, 1024)]
    prefill_cases = [(1, 2048), (4, 1024)]
    if not quick:
        decode_cases += [(1, 32768), (32, 8192), (256, 4096)]
        prefill_cases += [(1, 8192), (16, 512)]

    rows = []
    for num_seqs, context in decode_cases:
        p = make_paged(num_seqs, context, 1, kvh, group, d, bs, dtype, dev)
        q, k, v = contiguous_sdpa_inputs(p)
        gb = p.kv_bytes() / 1e9
        t_flash = bench(lambda p=p: paged_attention(*p.args(), max_query_len=1))
        t_naive = bench(lambda p=p: paged_attention_naive(*p.args()[:5], p.scale))
        t_sdpa = bench(lambda q=q, k=k, v=v, p=p: sdpa(q, k, v, p.scale))
        ours = paged_attention(*p.args(), max_query_len=1).float()
        err = (
            (ours - sdpa(q, k, v, p.scale).transpose(1, 2).reshape(ours.shape).float()).abs().max()
        )
        rows.append(
            [
                f"decode {num_seqs}x{context}",
                f"{t_flash * 1e3:.1f}",
                f"{gb / t_flash * 1e3:,.0f}",
                f"{gb / t_flash * 1e3 / copy_gbs:.0%}",
                f"{t_naive * 1e3:.1f}",
                f"{gb / t_naive * 1e3:,.0f}",
                f"{t_sdpa * 1e3:.1f}",
                f"{t_sdpa / t_flash:.2f}x",
                f"{err:.1e}",
            ]
        )
        del p, q, k, v
    print("decode (q_len 1): K/V bytes read / time, vs the copy bandwidth and vs torch SDPA")
    headers = ["case", "flash us", "GB/s", "%copy", "naive us", "GB/s", "sdpa us", "sdpa/flash"]
    print(_fmt_table(headers + ["max err"], rows) + "\n")

    rows = []
    for num_seqs, length in prefill_cases:
        p = make_paged(num_seqs, length, length, kvh, group, d, bs, dtype, dev)
        q, k, v = contiguous_sdpa_inputs(p)
        flops = 4 * num_seqs * kvh * group * d * length * (length + 1) / 2  # causal QK^T and PV
        t_flash = bench(lambda p=p: paged_attention(*p.args(), max_query_len=p.max_query_len))
        t_sdpa = bench(lambda q=q, k=k, v=v, p=p: sdpa(q, k, v, p.scale))
        ours = paged_attention(*p.args(), max_query_len=length).float()
        err = (
            (ours - sdpa(q, k, v, p.scale).transpose(1, 2).reshape(ours.shape).float()).abs().max()
        )
        rows.append(
            [
                f"prefill {num_seqs}x{length}",
                f"{t_flash * 1e3:.0f}",
                f"{flops / t_flash / 1e9:.0f}",
                f"{t_sdpa * 1e3:.0f}",
                f"{flops / t_sdpa / 1e9:.0f}",
                f"{t_sdpa / t_flash:.2f}x",
                f"{err:.1e}",
            ]
        )
        del p, q, k, v
    print("prefill (q_len == context, causal)")
    headers = ["case", "flash us", "TFLOP/s", "sdpa us", "TFLOP/s", "sdpa/flash", "max err"]
    print(_fmt_table(headers, rows) + "\n")

    rows = []
    for num_tokens in (256, 8192):
        key = torch.randn(num_tokens, kvh, d, dtype=dtype, device=dev)
        cache = torch.empty(-(-num_tokens // bs) * 2, bs, kvh, d, dtype=dtype, device=dev)
        vcache = torch.empty_like(cache)
        slots = torch.randperm(cache.shape[0] * bs, device=dev)[:num_tokens]
        moved = 4 * key.numel() * key.element_size() / 1e9  # K and V, each read once, written once
        t = bench(lambda k=key, c=cache, vc=vcache, s=slots: store_kvcache(k, k, c, vc, s))
        rows.append(
            [
                f"store {num_tokens} tokens",
                f"{t * 1e3:.1f}",
                f"{moved / t * 1e3:,.0f}",
                f"{moved / t * 1e3 / copy_gbs:.0%}",
            ]
        )
    print("store_kvcache: bytes read + written / time")
    print(_fmt_table(["case", "us", "GB/s", "%copy"], rows))


# ---------------------------------------------------------------------------------------------
# CPU: interpreted kernels on tiny shapes.
# ---------------------------------------------------------------------------------------------


def cpu_bench(quick: bool) -> None:
    from nanovllm.kernels.paged_attention import paged_attention
    from nanovllm.kernels.paged_attention_naive import paged_attention_naive
    from nanovllm.kernels.store_kvcache import store_kvcache

    repeats = 1 if quick else 3
    # Tiny shapes: torch's worker threads would cost more than the work (and, on a busy machine,
    # make the reference times erratic); the interpreter is single-threaded anyway.
    torch.set_num_threads(1)

    def best_ms(fn: Callable[[], object]) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    print("CPU: the kernels run in Triton's interpreter; times are NOT performance numbers.\n")
    kvh, group, d, bs, dtype = 2, 2, 64, 16, torch.float32
    rows = []

    def row(label: str, shape: str, ref: Callable[[], object], kernel: Callable[[], object]):
        t_ref, t_kernel = best_ms(ref), best_ms(kernel)
        rows.append([label, shape, f"{t_ref:.2f}", f"{t_kernel:.1f}", f"{t_kernel / t_ref:,.0f}x"])

    for num_seqs, context, q_len, label in [
        (2, 64, 1, "decode"),
        (2, 64, 16, "chunked prefill"),
        (2, 32, 32, "prefill"),
    ]:
        p = make_paged(num_seqs, context, q_len, kvh, group, d, bs, dtype, "cpu")
        shape = f"{num_seqs} seqs x {context} ctx, q_len {q_len}"
        row(
            f"paged_attention ({label})",
            shape,
            lambda p=p: paged_attention_ref(*p.args()),
            lambda p=p: paged_attention(*p.args(), max_query_len=p.max_query_len),
        )
        if q_len == 1:
            row(
                "paged_attention_naive",
                shape,
                lambda p=p: paged_attention_ref(*p.args()),
                lambda p=p: paged_attention_naive(*p.args()[:5], p.scale),
            )

    num_tokens = 32
    key = torch.randn(num_tokens, kvh, d)
    cache = torch.zeros(4, bs, kvh, d)
    vcache = torch.zeros_like(cache)
    slots = torch.randperm(4 * bs)[:num_tokens]
    row(
        "store_kvcache",
        f"{num_tokens} tokens",
        lambda: store_kvcache_ref(key, key, cache, vcache, slots),
        lambda: store_kvcache(key, key, cache, vcache, slots),
    )
    print(f"kv_heads {kvh}, query heads {kvh * group}, head_dim {d}, block_size {bs}, float32")
    print(_fmt_table(["kernel", "shape", "torch ref ms", "interp ms", "interp/ref"], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    args = parser.parse_args(argv)
    if not triton_setup.triton_available():
        print("triton is not installed (Linux x86_64 only): nothing to benchmark")
        return 0
    torch.manual_seed(0)
    if triton_setup.is_interpreted():
        cpu_bench(args.quick)
    else:
        gpu_bench(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
