"""The CPU backend's mixture-of-experts layer against the plain one (`backends/cpu_moe.py`).

    python -m nanovllm.bench.tools.cpu_moe [--tokens 1,8,32,256] [--repeats 20] [--threads 1] [--shapes tiny,mixtral,qwen3]

One MoE layer's experts (the router's choice made once, outside the timing), for each shape
and token count, through:

- `fused_experts`, the plain layer (`models/moe.py`): a Python loop over the experts, about ten
  torch calls for each expert that received tokens;
- `cpu_fused_experts` as the engine runs it: torch's grouped matmul (`F.grouped_mm`) when the
  step has at least as many (token, expert) pairs as experts, else one `torch.mm` per expert;
- `cpu_fused_experts` with `F.grouped_mm` always, and with the `torch.mm` loop always (what it
  runs on a torch without `F.grouped_mm`).

The shapes: the tests' tiny models (hidden 64, 4 experts, top-2), Mixtral-8x7B's with hidden and
expert sizes cut by 8, and Qwen3-30B-A3B's (128 experts, top-8) with them cut by 4, so each
layer's weights (up to 150 MB) fit and still come from memory rather than the CPU's caches.
Milliseconds are the median of `--repeats` calls. The figures on the team's machine are in
nanovllm/bench/README.md ("Mixture of experts on a CPU").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from nanovllm.backends.cpu_moe import cpu_fused_experts
from nanovllm.models.moe import fused_experts, select_experts

# name -> (label, (hidden, expert intermediate size, experts, top-k))
SHAPES = {
    "tiny": ("tiny (tests)", (64, 128, 4, 2)),
    "mixtral": ("Mixtral-8x7B / 8", (512, 1792, 8, 2)),
    "qwen3": ("Qwen3-30B-A3B / 4", (512, 192, 128, 8)),
}


def median_ms(fn: Callable[..., torch.Tensor], inputs: tuple, repeats: int, **options) -> float:
    """Median milliseconds of `fn(*inputs, **options)` over `repeats` calls."""
    fn(*inputs, **options)  # (first-call work: allocations)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*inputs, **options)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,8,32,256", help="token counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; milliseconds per call")
    print(
        f"{'shape':<20} {'tokens':>6} {'plain':>9} {'engine':>9} {'grouped_mm':>11} "
        f"{'mm loop':>9} {'speed-up':>9}"
    )
    for key in args.shapes.split(","):
        name, (hidden, inter, experts, top_k) = SHAPES[key]
        w13 = torch.randn(experts, 2 * inter, hidden, generator=generator) / hidden**0.5
        w2 = torch.randn(experts, hidden, inter, generator=generator) / inter**0.5
        gate = torch.randn(experts, hidden, generator=generator)
        for n in map(int, args.tokens.split(",")):
            x = torch.randn(n, hidden, generator=generator)
            weights, ids = select_experts(x @ gate.T, top_k, renormalize=True)
            inputs = (x, w13, w2, weights, ids)
            plain = median_ms(fused_experts, inputs, args.repeats)
            engine = median_ms(cpu_fused_experts, inputs, args.repeats)
            grouped = median_ms(cpu_fused_experts, inputs, args.repeats, use_grouped_mm=True)
            loop = median_ms(cpu_fused_experts, inputs, args.repeats, use_grouped_mm=False)
            print(
                f"{name:<20} {n:>6} {plain:>9.3f} {engine:>9.3f} {grouped:>11.3f} {loop:>9.3f} "
                f"{plain / engine:>8.2f}x"
            )


if __name__ == "__main__":
    main()
