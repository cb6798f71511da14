"""How many long requests fit at once in one KV budget, with the hybrid KV cache manager and
with every layer kept full (`disable_hybrid_kv_cache_manager`).

A sliding-window layer with a window of W tokens needs only the last W tokens' KV, so a long
request holds about W / block_size + 1 blocks in each sliding KV cache group instead of one per
block of its length (`core/sliding_window_manager.py`). This measures what that buys: for a
model's attention layout (its layers' types, window, KV heads and head size), a fixed KV budget
in bytes, and a workload of long requests all submitted at once, it runs the engine's own
`Scheduler` and `KVCacheManager` step by step (the forward pass replaced by a fixed sampled
token: memory does not depend on the model's math) and reports the most requests running at
once, and the steps the workload took, for both managers.

    python -m nanovllm.bench.tools.hybrid_memory --layout gemma-2-2b --budget-gib 4
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from nanovllm.config import EngineConfig
from nanovllm.core.kv_cache_interface import get_kv_cache_config, layer_specs
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.scheduler import Scheduler
from nanovllm.events import EventBus
from nanovllm.request import FinishReason, Request
from nanovllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class Layout:
    """What a model's KV cache looks like: its layers' types and window, its KV heads."""

    layer_types: tuple[str, ...]
    sliding_window: int
    num_key_value_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: dict) -> Layout:
        """From a Hugging Face config.json (`layer_types`, or every layer sliding when only
        `sliding_window` is set, as Mistral's)."""
        n = config["num_hidden_layers"]
        types = config.get("layer_types") or ["sliding_attention"] * n
        heads = config["num_attention_heads"]
        return cls(
            tuple(types),
            config["sliding_window"],
            config.get("num_key_value_heads") or heads,
            config.get("head_dim") or config["hidden_size"] // heads,
        )


def _alternating(n: int, every: int) -> tuple[str, ...]:
    """Layer i is full every `every`-th layer (i + 1 divisible), sliding otherwise (Gemma's)."""
    return tuple(
        "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)
    )


# Published configs' attention layouts (config.json's fields; no weights needed).
LAYOUTS = {
    "gemma-2-2b": Layout(_alternating(26, 2), 4096, 4, 256),
    "gemma-3-1b": Layout(_alternating(26, 6), 512, 1, 256),
    "mistral-7b-v0.1": Layout(("sliding_attention",) * 32, 4096, 8, 128),
}


def peak_concurrency(
    layout: Layout, budget_bytes: int, block_size: int, prompt_len: int, output_len: int,
    num_requests: int, disable_hybrid: bool, dtype_bytes: int = 2,
) -> dict:  # fmt: skip
    """Run the workload through the scheduler; the most requests running at once, and more."""
    n = len(layout.layer_types)
    specs = layer_specs(layout.layer_types, layout.sliding_window, n, block_size, disable_hybrid)
    kv_cache_config = get_kv_cache_config(specs)
    # A block: K and V of block_size tokens in each of the cache's tensor pairs.
    per_block = 2 * kv_cache_config.num_kv_tensors * layout.num_key_value_heads
    per_block *= layout.head_dim * block_size * dtype_bytes
    num_blocks = budget_bytes // per_block
    max_len = prompt_len + output_len
    config = EngineConfig(block_size=block_size, max_num_seqs=num_requests,
                          max_num_batched_tokens=8192, max_model_len=max_len)  # fmt: skip
    kv = KVCacheManager(num_blocks, block_size, False, EventBus(), kv_cache_config=kv_cache_config)
    scheduler = Scheduler(config, kv, EventBus())
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    for i in range(num_requests):
        scheduler.add_request(Request(f"r{i}", [2 + i % 100] * prompt_len, params, i))
    peak = steps = 0
    peak_blocks_per_request = 0.0
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        steps += 1
        running = len(scheduler.running)
        if running > peak:
            peak, peak_blocks_per_request = running, kv.num_used_blocks / running
        sampled = {s.request.request_id: [7] for s in out.scheduled if s.samples}
        for request, _ in scheduler.update_from_output(out, sampled):
            if request.num_output_tokens >= output_len:
                scheduler.finish_request(request, FinishReason.LENGTH)
    return dict(
        manager="every layer full" if disable_hybrid else "hybrid",
        kv_cache_groups=kv_cache_config.num_groups,
        kv_tensors=kv_cache_config.num_kv_tensors,
        num_blocks=num_blocks,
        peak_running=peak,
        blocks_per_request=round(peak_blocks_per_request, 1),
        steps=steps,
        preemptions=scheduler.num_preemptions,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="gemma-2-2b")
    parser.add_argument("--config", type=Path, help="a config.json instead of --layout")
    parser.add_argument("--budget-gib", type=float, default=4.0, help="KV budget (GiB)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=16384)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = parser.parse_args(argv)
    layout = (
        Layout.from_config(json.loads(args.config.read_text()))
        if args.config
        else LAYOUTS[args.layout]
    )
    dtype_bytes = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    budget = int(args.budget_gib * 2**30)
    print(f"{args.config or args.layout}: {budget / 2**30:g} GiB of KV ({args.dtype}), "
          f"{args.num_requests} requests of {args.prompt_len} + {args.output_len} tokens, "
          f"block_size {args.block_size}, window {layout.sliding_window}")  # fmt: skip
    for disable in (False, True):
        row = peak_concurrency(layout, budget, args.block_size, args.prompt_len,
                               args.output_len, args.num_requests, disable, dtype_bytes)  # fmt: skip
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
