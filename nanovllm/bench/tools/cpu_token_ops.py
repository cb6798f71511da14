"""`python -m nanovllm.bench.tools.cpu_token_ops`: RMSNorm and RoPE, torch against numba.

For each token count, each operation runs the model's torch code (`RMSNorm`, `RotaryEmbedding`)
and the numba kernel on the same tensors (`nanovllm.kernels.cpu_token_ops`) in alternation, and prints the median of each and their ratio. Shapes default
to the embedded model's (hidden 256, 4 query and 2 KV heads of 64); `--hidden`, `--heads`,
`--kv-heads`, `--head-dim` give another model's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from nanovllm.kernels import cpu_token_ops


def _median_us(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median microseconds per call of each function, the functions called in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    from nanovllm.models.layernorm import RMSNorm
    from nanovllm.models.rotary import RotaryEmbedding

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,64,512,2048", help="token counts, comma-separated")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args(argv)
    if not cpu_token_ops.applies(torch.zeros(1)):
        raise SystemExit("numba is not installed: there is no kernel to measure")
    torch.set_num_threads(args.threads)

    norm = RMSNorm(args.hidden, 1e-5)
    rotary = RotaryEmbedding(args.head_dim, 4096, {"rope_theta": 10000.0})

    print(f"torch threads {args.threads}; median us per call of {args.repeats}, in alternation")
    print(f"{'op':8s} {'tokens':>7s} {'torch':>9s} {'numba':>9s} {'torch/numba':>12s}")
    with torch.inference_mode():
        for n in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(n, args.hidden)
            q_size, kv_size = args.heads * args.head_dim, args.kv_heads * args.head_dim
            qkv = torch.randn(n, q_size + 2 * kv_size)
            q = qkv[:, :q_size].view(n, args.heads, args.head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(n, args.kv_heads, args.head_dim)
            positions = torch.randint(0, 4096, (n,))
            cases = {
                "rmsnorm": (
                    lambda x=x: norm(x),
                    lambda x=x: cpu_token_ops.rms_norm(x, norm.weight, norm.eps),
                ),
                "rope": (
                    lambda p=positions, q=q, k=k: rotary(p, q, k),
                    lambda p=positions, q=q, k=k: cpu_token_ops.rotary(
                        p, q, k, rotary.cos_cached, rotary.sin_cached
                    ),
                ),
            }
            for op, (torch_code, kernel) in cases.items():
                for _ in range(10):  # warm-up (and numba's compilation, the first time)
                    torch_code()
                    kernel()
                us = _median_us({"torch": torch_code, "numba": kernel}, args.repeats)
                ratio = us["torch"] / us["numba"]
                print(f"{op:8s} {n:7d} {us['torch']:9.1f} {us['numba']:9.1f} {ratio:11.2f}x")


if __name__ == "__main__":
    main()
