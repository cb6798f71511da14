"""oneDNN's prepacked matmul against `F.linear` on this machine (`backends/cpu_linear.py`).

    python -m nanovllm.bench.tools.cpu_linear

x [M, 768] times W [5120, 768] in float32, M from one decode row to a 512-token prefill, in
microseconds per product; the figures on the team's machine are in nanovllm/bench/README.md.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from nanovllm.backends.cpu_linear import linear


def microseconds(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    weight = torch.randn(5120, 768)  # [out, in]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    print(f"x [M, 768] times W [5120, 768], float32, {torch.get_num_threads()} threads, in us")
    print(f"{'M (rows)':>12} {'F.linear':>10} {'prepacked':>10}")
    for rows in (1, 16, 64, 512):
        x = torch.randn(rows, 768)
        plain = microseconds(lambda x=x: F.linear(x, weight))
        fast = microseconds(lambda x=x: linear(x, weight, None, packed))
        print(f"{rows:>12} {plain:>10.0f} {fast:>10.0f}")


if __name__ == "__main__":
    main()
