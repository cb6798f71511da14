"""`python -m nanovllm.bench.tools.quantized_matmul`: x W^T with W in GGUF blocks, float32 against the CPU kernels.

For each block type and row count, the same product runs as `F.linear` on W dequantized to
float32, through the float32 C kernel (`cpu_quantized_matmul_fp32`, "c": the CPU backend's
default), the numba kernel (`cpu_quantized_matmul`, Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K), the
int8 C kernel (`cpu_quantized_matmul_int8`, AVX-512 VNNI), the VNNI kernel with 16 features a
vector (`cpu_quantized_matmul_vnni`, Q8_0/Q4_0/Q4_1, at any number of rows; "vnni-pack": its
packing of the weight's panels alone, the part of a call that does not depend on the rows;
"vnni-packed": the product with W packed beforehand, as the int8 layers hold it) and the AMX one
(`cpu_quantized_matmul_amx`, Q8_0/Q4_0/Q4_1/Q4_K/Q5_K, where the CPU has it), called in turn, and prints
each one's fastest and median milliseconds, wall clock and the process's CPU time (all threads;
on a loaded machine the steadier of the two), with `uptime` before and after. Above the kernels'
`KERNEL_MAX_ROWS` (a prefill) the c, numba and VNNI rows are what their layers do there instead:
W dequantized (by the C or numba decoder, or the reference's torch code), then `F.linear`.
Each way's line also gives its rate per core, GFLOP/s (2 rows out in per call, over the fastest
CPU time of all threads), and `--peak` prints one core's float32 FMA peak beside them (the C
kernel's `fma_peak`: 10 independent chains of register-only FMAs). W is random
blocks of the LM head's shape of SmolLM2-135M by default (`--out`, `--in`); `--smollm2` takes
each of SmolLM2-135M's linear shapes in turn.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from nanovllm.kernels import (
    cpu_quantized_matmul,
    cpu_quantized_matmul_amx,
    cpu_quantized_matmul_fp32,
    cpu_quantized_matmul_int8,
    cpu_quantized_matmul_vnni,
)
from nanovllm.models.gguf_quants import FORMATS, QuantizedTensor, dequantize
from nanovllm.models.quantized_linear import KERNEL_MAX_ROWS, dequantize_linear

# SmolLM2-135M's linear layers: name -> (out, in)
SMOLLM2_SHAPES = {
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}

# Where each block type keeps its float16 scales (byte offsets in a block); the rest of a
# block's bytes may be anything.
HALF_OFFSETS = {
    "Q8_0": [0],
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}


def random_blocks(rows: int, blocks: int, qtype: str, seed: int = 0) -> np.ndarray:
    """uint8 [rows, blocks * block_bytes]: random quants of `qtype` with finite float16 scales
    of about 0.01 (also for the types `gguf` cannot quantize to, the K-quants)."""
    size = FORMATS[qtype].block_bytes
    generator = np.random.default_rng(seed)
    raw = generator.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    for offset in HALF_OFFSETS[qtype]:
        scales = (generator.standard_normal((rows, blocks, 1)) * 0.01).astype(np.float16)
        raw[..., offset : offset + 2] = scales.view(np.uint8)
    return raw.reshape(rows, blocks * size)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def matmul_ways(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> dict[str, Callable]:
    """Each way to compute x W^T that applies here, by name (see the module docstring)."""
    weight = dequantize(raw, qtype)
    ways = {"fp32": functools.partial(F.linear, x, weight)}
    exact = (("c", cpu_quantized_matmul_fp32), ("numba", cpu_quantized_matmul))
    if x.shape[0] > KERNEL_MAX_ROWS:  # a prefill: what the c, numba and VNNI layers do there
        for name, kernel in exact:
            if kernel.applies(x, qtype):
                decode = functools.partial(kernel.dequantize, raw, qtype)
                ways[name] = lambda decode=decode: F.linear(x, decode())
        qweight = QuantizedTensor(raw, qtype, x.shape[1])
        ways["int8"] = functools.partial(dequantize_linear, x, qweight, None)
    else:
        for name, kernel in (*exact, ("int8", cpu_quantized_matmul_int8)):
            if kernel.applies(x, qtype):
                ways[name] = functools.partial(kernel.quantized_matmul, x, raw, qtype)
    if cpu_quantized_matmul_vnni.applies(x, qtype):  # (at any number of rows)
        vnni = cpu_quantized_matmul_vnni
        ways["vnni"] = functools.partial(vnni.quantized_matmul, x, raw, qtype)
        ways["vnni-pack"] = functools.partial(vnni.pack, raw, qtype)
        packed = vnni.pack(raw, qtype)
        ways["vnni-packed"] = functools.partial(
            vnni.quantized_matmul_packed, x, packed, qtype, raw.shape[0]
        )
    if cpu_quantized_matmul_amx.applies(x, qtype):
        ways["amx"] = functools.partial(cpu_quantized_matmul_amx.quantized_matmul, x, raw, qtype)
    return ways


def time_ways(ways: dict[str, Callable], repeats: int) -> tuple[dict, dict]:
    """Each way's wall and CPU milliseconds over `repeats` rounds, the ways in turn each round."""
    wall: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for fn in ways.values():
        fn()  # (compilation, first touch)
    for _ in range(repeats):
        for name, fn in ways.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append((time.perf_counter() - w0) * 1e3)
            cpu[name].append((time.process_time() - c0) * 1e3)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q8_0,Q4_0,Q4_1,Q4_K,Q5_K,Q6_K")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--out", type=int, default=49152)
    parser.add_argument("--in", dest="in_features", type=int, default=576)
    parser.add_argument("--smollm2", action="store_true", help="each of SmolLM2-135M's shapes")
    parser.add_argument(
        "--shapes", default="", help="in:out pairs, e.g. 576:576,576:192 (instead of --out/--in)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--peak", action="store_true", help="one core's float32 FMA peak too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = SMOLLM2_SHAPES if args.smollm2 else {"W": (args.out, args.in_features)}
    if args.shapes:
        pairs = [tuple(map(int, pair.split(":"))) for pair in args.shapes.split(",")]
        shapes = {f"{i}>{o}": (o, i) for i, o in pairs}
    print(uptime(), f"| {args.threads} threads")
    lib = cpu_quantized_matmul_fp32.load()
    if args.peak and lib is not None:
        print(f"one core's float32 FMA peak: {lib.fma_peak(200_000_000) / 1e9:.1f} GFLOP/s")
    print(
        "shape    type  rows  way      wall ms fastest/median   CPU ms fastest/median   GFLOP/s a core"
    )
    for shape, (out_features, in_features) in shapes.items():
        for qtype in args.types.split(","):
            blocks = in_features // FORMATS[qtype].block_size
            raw = torch.from_numpy(random_blocks(out_features, blocks, qtype))
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, blocks * FORMATS[qtype].block_size)
                ways = matmul_ways(x, raw, qtype)
                wall, cpu = time_ways(ways, args.repeats)
                flops = 2 * rows * out_features * x.shape[1]
                for name in ways:
                    print(
                        f"{shape:8} {qtype:5} {rows:5}  {name:6} {min(wall[name]):9.2f} / "
                        f"{statistics.median(wall[name]):<9.2f} {min(cpu[name]):9.2f} / "
                        f"{statistics.median(cpu[name]):<9.2f} "
                        f"{flops / min(cpu[name]) / 1e6:9.1f}",
                        flush=True,
                    )
    print(uptime())


if __name__ == "__main__":
    main()
