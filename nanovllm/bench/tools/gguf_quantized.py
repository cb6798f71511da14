"""A GGUF file's weights dequantized to float32 at load against kept quantized, side by side.

    python -m nanovllm.bench.tools.gguf_quantized [--model smollm2] [--batch 32] [--steps 16]
        [--threads 2]

For each way of holding the weights, on the same file, in one process (the CPU backend):

- "fp32": `dequantize_gguf=True`, every weight dequantized to float32 at load (the old way);
- "quantized": Q8_0, Q4_0 and Q4_1 weights kept as the file's blocks, multiplied by the numba
  kernels (`backends/cpu_quantized.py`);

it prints the load time (the engine built, file to first step), the bytes the model's weights
take in memory (parameters, plus the blocks), the growth of the process's resident memory over
the load (`/proc/self/statm`; the first way loaded also pays for importing and the tokenizer),
and the median time of a decode step with `--batch` sequences (after one prefill step of
`--prompt` tokens each), against the file's size. Figures on the team's machine:
nanovllm/kernels/README.md ("Quantized weights").
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.models.gguf_loader import resolve_packaged
from nanovllm.models.quantized_linear import QuantizedWeight


def resident_bytes() -> int:
    """The process's resident memory (Linux: /proc/self/statm); 0 elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes the model's weights hold: its real parameters (not the meta-device shapes of
    quantized layers), and each quantized layer's blocks once (a tied LM head shares them)."""
    params = {id(p): p for p in model.parameters() if p.device.type != "meta"}
    total = sum(p.numel() * p.element_size() for p in params.values())
    return total + sum(
        m.qweight.nbytes
        for m in model.modules()
        if isinstance(m, QuantizedWeight) and m.qweight is not None
    )


def measure(path: Path, dequantize: bool, args: argparse.Namespace) -> dict:
    """Load the file one way, then time decode steps."""
    gc.collect()
    rss = resident_bytes()
    start = time.perf_counter()
    llm = LLM(
        str(path),
        dequantize_gguf=dequantize,
        num_kv_blocks=args.batch * ((args.prompt + args.steps + 2) // 16 + 2),
        block_size=16,
        max_num_seqs=args.batch,
        num_threads=args.threads,
        attention_backend="cpu",
    )
    load_s = time.perf_counter() - start
    engine = llm.llm_engine
    model = engine.runner.model
    loaded = {"load_s": load_s, "rss": resident_bytes() - rss, "weights": weight_bytes(model)}
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 1, ignore_eos=True)
    vocab = engine.model_args.vocab_size
    for i in range(args.batch):
        prompt = [(i * 131 + j * 7) % vocab for j in range(args.prompt)]
        engine.add_request(f"q{i}", prompt, params)
    engine.step()  # the prefill
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    loaded["step_ms"] = statistics.median(times) * 1e3
    del llm, engine, model
    return loaded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a GGUF file, or smollm2")
    parser.add_argument("--batch", type=int, default=32, help="sequences decoded per step")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per sequence")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    path = resolve_packaged(args.model) or Path(args.model)
    size = path.stat().st_size
    print(f"{path.name}: {size / 2**20:.1f} MiB; {args.batch} sequences, {args.threads} threads")
    print(f"{'weights':<10} {'load s':>7} {'weight MiB':>11} {'x file':>7} {'RSS +MiB':>9} "
          f"{'decode step ms':>15}")  # fmt: skip
    rows = {}
    for label, dequantize in (("fp32", True), ("quantized", False)):
        row = rows[label] = measure(path, dequantize, args)
        print(
            f"{label:<10} {row['load_s']:>7.2f} {row['weights'] / 2**20:>11.1f} "
            f"{row['weights'] / size:>7.2f} {row['rss'] / 2**20:>9.1f} {row['step_ms']:>15.1f}"
        )
    speedup = rows["fp32"]["step_ms"] / rows["quantized"]["step_ms"]
    print(f"decode step: quantized is {speedup:.2f}x the speed of fp32")


if __name__ == "__main__":
    main()
