"""A GGUF file's weights dequantized to float32 at load against kept quantized, side by side.

    python -m nanovllm.bench.tools.gguf_quantized [--model smollm2] [--batch 32] [--steps 16]
        [--threads 2] [--ways fp32,quantized,int8] [--requantize Q8_0 --out smollm2-q8_0.gguf]

For each way of holding the weights, on the same file, in one run (the CPU backend):

- "fp32": `dequantize_gguf=True`, every weight dequantized to float32 at load (the old way);
- "quantized": Q8_0, Q4_0, Q4_1 and K-quant weights kept as the file's blocks, multiplied by the
  CPU backend's default kernels (numba: `backends/cpu_quantized.py`);
- "int8": kept as blocks, with `gguf_int8_activations=True`: x rounded to int8 blocks and
  multiplied in integers by the C kernel, as llama.cpp does (`backends/cpu_quantized_int8.py`);

each in a fresh process of its own, it first builds the CPU backend's model alone, as the
engine does, and prints the seconds its weights took to load (the file's metadata already
parsed), the bytes they take in memory (parameters, plus the blocks) and the growth of the
process's anonymous resident memory over the load (`RssAnon`: the weights, and the CPU
backend's packed copies of float32 ones; not the file's pages, the kernel's page cache); then it builds the engine, and prints the seconds
that took (metadata, tokenizer, weights, KV cache), and the median time of a decode step with
`--batch` sequences (after one prefill step of `--prompt` tokens each). Figures on the team's
machine: nanovllm/kernels/README.md ("Quantized weights").

`--requantize TYPE --out FILE` first writes FILE, a copy of the model's file (every metadata
key) with each weight matrix re-quantized to TYPE from its dequantized values (`gguf`'s own
quantizer; norms stay F32), then measures FILE: a Q8_0 or Q4_0 file of the same model when only
a Q4_1 one is at hand (re-quantizing stacks two roundings: for speed and memory, not quality).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.backends import get_backend
from nanovllm.models.gguf_loader import open_gguf, resolve_packaged
from nanovllm.models.loader import load_model
from nanovllm.models.model_layers import ModelLayers
from nanovllm.models.quantized_linear import QuantizedWeight


def resident_bytes() -> int:
    """The process's anonymous resident memory (Linux: RssAnon in /proc/self/status); 0
    elsewhere. Anonymous: the memory-mapped file's pages are the kernel's page cache, shared
    and reclaimable, and not the process's own."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    line = next((x for x in status.splitlines() if x.startswith("RssAnon:")), None)
    return int(line.split()[1]) * 1024 if line else 0


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


def requantize(src: Path, dst: Path, qtype: str) -> Path:
    """Write `dst`: `src` with every weight matrix re-quantized to `qtype` (see above)."""
    import gguf

    reader = open_gguf(src)
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub_type = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type)
    target = gguf.GGMLQuantizationType[qtype]
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype("float32")
        if values.ndim == 2 and values.shape[1] % 32 == 0:
            data = gguf.quants.quantize(values, target)
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=target)
        else:
            writer.add_tensor(tensor.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


# Each way of holding the weights: the engine options that give it.
WAYS = {
    "fp32": dict(dequantize_gguf=True),
    "quantized": {},
    "int8": dict(gguf_int8_activations=True),
}


def load_weights_alone(path: Path, way: str) -> dict:
    """Build the CPU backend's model from the file, as the engine does, and measure it: seconds
    to load the weights (the metadata already parsed), their bytes, and the growth of resident
    memory (the model alone, packed copies included)."""
    backend = get_backend("cpu")
    cpu, dtype = torch.device("cpu"), torch.float32
    layers = backend.model_layers(ModelLayers(backend.attention_class), dtype, cpu, True)
    if way != "fp32":
        layers = backend.quantized_layers(layers, dtype, cpu, True, way == "int8")
    open_gguf(path)  # (the metadata, parsed once per process: not the weights' time)
    gc.collect()
    rss = resident_bytes()
    start = time.perf_counter()
    model = load_model(path, dtype, cpu, layers, 2048)
    backend.prepare_model(model)
    loaded = {"weights_s": time.perf_counter() - start, "rss": resident_bytes() - rss}
    loaded["weights"] = weight_bytes(model)
    del model
    return loaded


def measure(path: Path, way: str, args: argparse.Namespace) -> dict:
    """Load the weights one way and measure them, then build the engine that way and time
    its decode steps."""
    loaded = load_weights_alone(path, way)
    start = time.perf_counter()
    llm = LLM(
        str(path),
        **WAYS[way],
        num_kv_blocks=args.batch * ((args.prompt + args.steps + 2) // 16 + 2),
        block_size=16,
        max_num_seqs=args.batch,
        num_threads=args.threads,
        attention_backend="cpu",
    )
    loaded["load_s"] = time.perf_counter() - start
    engine = llm.llm_engine
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
    return loaded


def measure_in_subprocess(path: Path, way: str, args: argparse.Namespace) -> dict:
    """`measure` in a fresh Python process (so that one way's memory is not the other's)."""
    options = vars(args) | {"model": str(path), "requantize": None, "out": None}
    code = (
        "import argparse, json, sys; from pathlib import Path; "
        "from nanovllm.bench.tools.gguf_quantized import measure; "
        "args = argparse.Namespace(**json.loads(sys.argv[1])); "
        "print('RESULT', json.dumps(measure(Path(args.model), sys.argv[2], args)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(options), way],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"measuring {path} failed:\n{done.stdout}\n{done.stderr}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a GGUF file, or smollm2")
    parser.add_argument("--batch", type=int, default=32, help="sequences decoded per step")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per sequence")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ways", default=",".join(WAYS), help="of: " + ", ".join(WAYS))
    parser.add_argument("--requantize", choices=("Q8_0", "Q4_0", "Q4_1"), default=None)
    parser.add_argument("--out", type=Path, help="the re-quantized file (with --requantize)")
    args = parser.parse_args(argv)
    ways = args.ways.split(",")
    if "fp32" not in ways or any(way not in WAYS for way in ways):
        parser.error(f"--ways {args.ways!r}: fp32 and any of {', '.join(WAYS)}")
    path = resolve_packaged(args.model) or Path(args.model)
    if args.requantize:
        if args.out is None:
            parser.error("--requantize needs --out FILE")
        start = time.perf_counter()
        path = requantize(path, args.out, args.requantize)
        print(f"wrote {path} ({args.requantize}) in {time.perf_counter() - start:.1f} s")
    size = path.stat().st_size
    print(f"{path.name}: {size / 2**20:.1f} MiB; {args.batch} sequences, {args.threads} threads")
    print(f"{'weights':<10} {'weights s':>9} {'weight MiB':>11} {'x file':>7} {'RSS +MiB':>9} "
          f"{'engine s':>9} {'decode step ms':>15}")  # fmt: skip
    rows = {}
    for label in ways:
        row = rows[label] = measure_in_subprocess(path, label, args)
        print(
            f"{label:<10} {row['weights_s']:>9.2f} {row['weights'] / 2**20:>11.1f} "
            f"{row['weights'] / size:>7.2f} {row['rss'] / 2**20:>9.1f} {row['load_s']:>9.2f} "
            f"{row['step_ms']:>15.1f}"
        )
    for label in ways[1:]:
        speedup = rows["fp32"]["step_ms"] / rows[label]["step_ms"]
        print(f"decode step: {label} is {speedup:.2f}x the speed of fp32")


if __name__ == "__main__":
    main()
