"""Lesson 18 demo: a decode step reads every weight once, so its bytes set its time.

1. This machine's memory bandwidth, measured: a 128 MB float32 tensor summed (read only) and
   copied (read and written), the fastest of a few tries each.
2. The bytes a decode step reads for two models, the demo model and SmolLM2-135M (from their
   shapes), at float32, Q8_0, Q4_1 and Q4_0, and the step time those bytes allow at the
   measured bandwidth: the floor no kernel can go under.
3. One matrix-vector product, a decode step's kind of matmul (one token, float32 weights),
   timed against its floor.
4. One block of the demo model's weights in Q8_0: its scale, its 32 integers, and what
   comes back.

Run it: `nanovllm lesson 18 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import json
import time

from rich.console import Console
from rich.table import Table

from nanovllm.lessons.demo_support import demo_model_path, section

MB = 1e6
# Bits per weight of each format: a Q block is 32 weights and its header (2 bytes of float16
# scale; Q4_1 also a 2-byte minimum).
BITS = {"float32": 32, "Q8_0": 34 * 8 / 32, "Q4_1": 20 * 8 / 32, "Q4_0": 18 * 8 / 32}
# SmolLM2-135M-Instruct's shapes (its config.json): a Llama of 30 layers, tied embeddings.
SMOLLM2 = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, vocab_size=49152,
)  # fmt: skip


def decode_weights(config: dict) -> int:
    """The weights one decode step reads: every layer's q, k, v, o, gate, up and down
    projections, and the LM head (the whole vocabulary's rows, tied to the embedding or not;
    the embedding itself gives one row per token, and the norms are a few thousand floats)."""
    h, i = config["hidden_size"], config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q = config["num_attention_heads"] * d
    kv = config["num_key_value_heads"] * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    return config["num_hidden_layers"] * per_layer + config["vocab_size"] * h


def measure_bandwidth(nbytes: int = 128 * 2**20, tries: int = 4) -> tuple[float, float]:
    """Bytes per second read (a sum over a float32 tensor of `nbytes`) and moved by a copy
    (read and written: 2 * nbytes), each the fastest of `tries`."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    read = copy = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        src.sum()
        read = min(read, time.perf_counter() - start)
        start = time.perf_counter()
        dst.copy_(src)
        copy = min(copy, time.perf_counter() - start)
    return nbytes / read, 2 * nbytes / copy


def _bandwidth(console: Console) -> float:
    import torch

    section(console, "1. This machine's memory bandwidth")
    read, copy = measure_bandwidth()
    console.print(
        f"{torch.get_num_threads()} threads: read {read / 1e9:.1f} GB/s (a sum of 128 MB), "
        f"copy {copy / 1e9:.1f} GB/s (128 MB read and 128 MB written). Measured now, beside "
        "whatever else runs: a busy machine reads slower."
    )
    return read


def _floors(console: Console, read: float) -> None:
    section(console, "2. The bytes of a decode step, and the time they take at least")
    demo = json.loads((demo_model_path() / "config.json").read_text())
    table = Table()
    table.add_column("model")
    table.add_column("weights read")
    for fmt in BITS:
        table.add_column(f"{fmt} ({BITS[fmt]:g} bits)")
    for name, config in (("demo model", demo), ("SmolLM2-135M", SMOLLM2)):
        n = decode_weights(config)
        cells = [
            f"{n * BITS[fmt] / 8 / MB:.1f} MB, {n * BITS[fmt] / 8 / read * 1e3:.2f} ms"
            for fmt in BITS
        ]
        table.add_row(name, f"{n / 1e6:.1f} M", *cells)
    console.print(table)
    console.print(
        "Each cell: the bytes, then the bytes over the measured read bandwidth, the step time no "
        "kernel beats. A decode step does 2 floating-point operations per weight per sequence "
        "(a multiply and an add), so with a few sequences the cores wait on memory: reading "
        "fewer bytes per weight is what makes the step faster. Q8_0 reads 3.8x fewer bytes than "
        "float32, Q4_0 7.1x. (The demo model's 17 MB may fit in the processor's last-level "
        "cache, which is faster than memory; SmolLM2's 538 MB does not.)"
    )


def _matvec(console: Console, read: float) -> None:
    import torch
    import torch.nn.functional as F

    section(console, "3. One token times a float32 weight: a decode step's matmul")
    w = torch.full((8192, 2048), 0.5)  # 64 MB
    x = torch.ones(1, 2048)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        F.linear(x, w)
        best = min(best, time.perf_counter() - start)
    nbytes = w.numel() * 4
    console.print(
        f"y = x W^T, x [1, 2048], W [8192, 2048] float32 ({nbytes / MB:.0f} MB): {best * 1e3:.2f} "
        f"ms, against the floor {nbytes / read * 1e3:.2f} ms at {read / 1e9:.1f} GB/s "
        f"({nbytes / best / 1e9:.1f} GB/s of weights read): the time is the bytes'. A second token "
        "in the batch would add 16.8 M multiply-adds and no bytes."
    )


def _block(console: Console) -> None:
    import torch
    from safetensors.torch import load_file

    from nanovllm.lessons.catalog import get_lesson, lesson_module

    reference = lesson_module(get_lesson(18), "reference")
    section(console, "4. One Q8_0 block: 32 weights of the demo model's first layer")
    weights = load_file(str(demo_model_path() / "model.safetensors"))
    x = weights["model.layers.0.self_attn.q_proj.weight"][:1, :32].float()  # [1, 32]
    raw = reference.quantize_q8_0(x)  # [1, 34]
    d = raw[0, :2].view(torch.float16).item()
    q = raw[0, 2:].view(torch.int8)
    back = reference.dequantize_q8_0(raw)[0]
    err = (back - x[0]).abs()
    console.print(f"max |x| = {x.abs().max().item():.5f}, so d = max |x| / 127 = {d:.6f}")
    console.print(f"q = {q.tolist()}")
    table = Table()
    for col in ("j", "x_j", "q_j", "q_j * d", "error"):
        table.add_column(col)
    for j in range(6):
        table.add_row(
            str(j), f"{x[0, j].item():+.5f}", str(int(q[j])), f"{back[j].item():+.5f}",
            f"{err[j].item():.5f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"Largest error in the block {err.max().item():.5f}, at most d / 2 = {d / 2:.5f} (and "
        "a hair more for d's own rounding to float16). 34 bytes hold what took 128: 8.5 bits a "
        "weight."
    )


def run(console: Console) -> None:
    read = _bandwidth(console)
    _floors(console, read)
    _matvec(console, read)
    _block(console)


if __name__ == "__main__":
    run(Console(highlight=False))
