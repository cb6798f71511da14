"""The packed matmuls against `F.linear` on this machine (`backends/cpu_linear.py`).

    python -m nanovllm.bench.tools.cpu_linear [--rows 8,32,64,256] [--layers 30]

One forward pass's linear layers, SmolLM2-135M's shapes (per layer: q/k/v 960 x 576, o 576 x
576, gate/up 3,072 x 576, down 576 x 1,536), each layer with its own random weights, so that, as
in a real forward pass, the weights come from memory rather than from the CPU's caches. For each
row count, the milliseconds one pass took (the median of 8) through:

- `F.linear` on the plain weights;
- oneDNN's product with prepacked weights;
- MKL's packed sgemm, the weights packed for 256 rows (what the engine runs), and packed for one
  row (to show that the row count MKL packs for matters to speed);
- our C kernel's panels (`kernels/cpu_linear_c`), where it builds (AVX-512).

and each one's speed-up over oneDNN's, side by side in one run. The figures on the team's
machine are in nanovllm/bench/README.md ("MKL's packed sgemm").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from nanovllm.backends import cpu_linear
from nanovllm.backends.cpu_linear import linear, pack_weight
from nanovllm.kernels import cpu_linear_c

# [out, in] of one decoder layer's four linear weights: SmolLM2-135M's.
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def pass_ms(product: Callable, weights: list, xs: list[torch.Tensor], repeats: int = 8) -> float:
    """Median milliseconds of one pass: every layer's four products, in order."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for layer in weights:
            for x, w in zip(xs, layer, strict=True):
                product(x, w)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="8,32,64,256", help="rows of x, comma-separated")
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    plain = [
        [torch.randn(out, inp, generator=generator) * 0.02 for out, inp in SHAPES]
        for _ in range(args.layers)
    ]
    ways: dict[str, tuple[Callable, list]] = {"F.linear": (lambda x, w: F.linear(x, w), plain)}

    def packed_product(x: torch.Tensor, w: tuple) -> torch.Tensor:  # w: (weight, its packing)
        return linear(x, w[0], None, w[1])

    def packed(library: str, rows: int = cpu_linear.MKL_PACK_ROWS) -> list:
        return [[(w, pack_weight(w, library, rows)) for w in ws] for ws in plain]

    ways["oneDNN"] = (packed_product, packed("onednn"))
    if cpu_linear.mkl_packs_for_any_rows():
        for pack_rows in (cpu_linear.MKL_PACK_ROWS, 1):
            ways[f"MKL, packed for {pack_rows}"] = (packed_product, packed("mkl", pack_rows))
    else:
        print("MKL's packed sgemm is not usable here (see backends/cpu_linear.py)")
    if cpu_linear_c.load() is not None:
        ways["C panels"] = (packed_product, packed("c"))
    print(
        f"{args.layers} layers of SmolLM2-135M's linear shapes, float32, "
        f"{torch.get_num_threads()} threads: ms per pass (speed-up over oneDNN)"
    )
    print(f"{'rows':>6} " + " ".join(f"{name:>22}" for name in ways))
    for rows in (int(r) for r in args.rows.split(",")):
        xs = [torch.randn(rows, inp, generator=generator) for _, inp in SHAPES]
        ms = {name: pass_ms(product, weights, xs) for name, (product, weights) in ways.items()}
        cells = [f"{v:>10.1f} ({ms['oneDNN'] / v:.2f}x)" for v in ms.values()]
        print(f"{rows:>6} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
