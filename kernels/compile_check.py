"""Compile every kernel for a GPU this machine does not have: `python -m nanovllm.kernels.compile_check`.

The CPU interpreter checks what a kernel computes, but it runs Python, not the Triton compiler: a
kernel can pass every interpreter test and still fail to compile for a GPU (a shape tl.dot rejects,
a loop-carried variable that changes type, too much shared memory). Triton can compile without a
GPU, though: lowering to PTX needs only the compiler, and Triton's wheel ships the `ptxas` that
turns PTX into a cubin. So this tool

1. runs the real wrappers (`store_kvcache`, `paged_attention_naive`, `paged_attention`) on
   "meta" tensors (shapes and dtypes, no memory), with each kernel's launch replaced by a recorder
   that keeps the arguments, constexprs and launch options the wrapper chose;
2. compiles each recorded launch for the requested GPU architectures (default sm_80 and sm_90)
   and prints registers and stack bytes per thread (a nonzero stack usually means spills) and
   shared memory per program.

Nothing is launched. It needs a process where the kernels are compiled, not interpreted: `main()`
sets TRITON_INTERPRET=0 (unless it is already set) and refuses to run if the kernels were already
set up as interpreted. Importing this module changes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

from nanovllm.kernels import checks, triton_setup

# Shared memory per block that each architecture can give one program (opt-in maximum), bytes.
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}


@dataclass
class Launch:
    """One recorded kernel launch: the JIT function and exactly what the wrapper passed it."""

    label: str
    fn: Any  # triton.runtime.jit.JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]  # constexprs given by name, and launch options (num_warps, ...)


def _record_launches(label: str, call) -> list[Launch]:
    """Run `call()` with every JITFunction launch replaced by a recorder."""
    from triton.runtime.jit import JITFunction

    recorded: list[Launch] = []

    def record(self, *args, grid, warmup, **kwargs):
        recorded.append(Launch(label, self, args, kwargs))

    original_run, original_device_check = JITFunction.run, checks.check_device_for_mode
    JITFunction.run = record
    checks.check_device_for_mode = lambda t, interpreted: None  # meta tensors are fine: no launch
    try:
        call()
    finally:
        JITFunction.run, checks.check_device_for_mode = original_run, original_device_check
    return recorded


def compile_launch(launch: Launch, arch: int) -> dict[str, Any]:
    """Compile one recorded launch for sm_<arch> as `kernel[grid](...)` would; return its resources.

    It goes through the same steps as `JITFunction.run` (Triton 3.x internals): the binder
    specialises the arguments (16-byte-aligned pointers and ints divisible by 16 are marked so,
    which is what lets the compiler vectorise loads), then `_pack_args` builds the signature,
    constexprs and attributes. Meta tensors report address 0, i.e. aligned like a real allocation.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.fn
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, launch.kwargs, bound_args, specialization, options
    )
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    cubin = compiled.asm.get("cubin")
    assert cubin, "no cubin produced"
    return {"shared": compiled.metadata.shared, **_resource_usage(cubin)}


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers and stack (spills land on the stack) per thread, read with Triton's cuobjdump."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        report = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = dict(re.findall(r"\b(REG|STACK):(\d+)", report))
    return {"regs": int(usage.get("REG", -1)), "stack": int(usage.get("STACK", -1))}


def _meta_paged_batch(
    dtype: torch.dtype,
    num_seqs: int,
    num_tokens: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
) -> dict[str, torch.Tensor]:
    meta = torch.device("meta")
    cache_shape = (64, block_size, num_kv_heads, head_dim)
    return dict(
        query=torch.empty((num_tokens, num_kv_heads * group, head_dim), dtype=dtype, device=meta),
        key_cache=torch.empty(cache_shape, dtype=dtype, device=meta),
        value_cache=torch.empty(cache_shape, dtype=dtype, device=meta),
        block_tables=torch.empty((num_seqs, 64), dtype=torch.int32, device=meta),
        seq_lens=torch.empty((num_seqs,), dtype=torch.int32, device=meta),
    )


def _fused_moe_launches() -> list[Launch]:
    """fused_experts' two launches (w13, then w2), with decode's small tiles and prefill's large
    ones, at Qwen3-30B-A3B's expert shapes (8 of its 128 experts). Its expert sort reads the
    routing, so these are small CPU tensors, not meta ones (`torch.empty`: nothing is written)."""
    from nanovllm.kernels.fused_moe import fused_experts

    num_experts, hidden, intermediate, top_k = 8, 2048, 768, 8
    launches: list[Launch] = []
    for dtype, num_tokens in ((torch.bfloat16, 4), (torch.bfloat16, 512)):
        x = torch.empty((num_tokens, hidden), dtype=dtype)
        w13 = torch.empty((num_experts, 2 * intermediate, hidden), dtype=dtype)
        w2 = torch.empty((num_experts, hidden, intermediate), dtype=dtype)
        weights = torch.ones((num_tokens, top_k))
        ids = torch.arange(top_k).repeat(num_tokens, 1)
        launches += _record_launches(
            f"fused_moe {str(dtype)[6:]} {num_tokens} tokens",
            lambda x=x, w13=w13, w2=w2, weights=weights, ids=ids: fused_experts(
                x, w13, w2, weights, ids
            ),
        )
    return launches


def _quantized_matmul_launches() -> list[Launch]:
    """quantized_matmul's launch for Q8_0 and Q4_0 blocks, a decode step's rows at SmolLM2's
    gate/up shape."""
    from nanovllm.kernels.quantized_matmul import quantized_matmul
    from nanovllm.kernels.quantized_matmul_reference import BLOCK_BYTES

    meta = torch.device("meta")
    launches: list[Launch] = []
    for qtype in ("Q8_0", "Q4_0"):
        x = torch.empty((8, 576), dtype=torch.bfloat16, device=meta)
        raw = torch.empty((3072, 576 // 32 * BLOCK_BYTES[qtype]), dtype=torch.uint8, device=meta)
        launches += _record_launches(
            f"quantized_matmul {qtype}",
            lambda x=x, raw=raw, qtype=qtype: quantized_matmul(x, raw, qtype),
        )
    return launches


def standard_launches() -> list[Launch]:
    """The launches the engine makes, over the dtypes, head dims and GQA ratios that matter."""
    from nanovllm.kernels.paged_attention import paged_attention
    from nanovllm.kernels.paged_attention_naive import paged_attention_naive
    from nanovllm.kernels.store_kvcache import store_kvcache

    meta = torch.device("meta")
    launches: list[Launch] = []

    for dtype in (torch.float16, torch.bfloat16):
        b = _meta_paged_batch(dtype, 4, 4, 8, 1, 128, 16)
        key = torch.empty((4, 8, 128), dtype=dtype, device=meta)
        slots = torch.empty((4,), dtype=torch.int64, device=meta)
        launches += _record_launches(
            f"store_kvcache {str(dtype)[6:]}",
            lambda b=b, key=key, slots=slots: store_kvcache(
                key, key, b["key_cache"], b["value_cache"], slots
            ),
        )

    b = _meta_paged_batch(torch.float16, 4, 4, 2, 4, 128, 16)
    launches += _record_launches(
        "naive decode fp16 d128 g4",
        lambda: paged_attention_naive(
            b["query"], b["key_cache"], b["value_cache"], b["block_tables"], b["seq_lens"], 0.1
        ),
    )

    # A sliding-window layer (Mistral's window) with Gemma 2's soft cap: the kernel's other branch.
    window = {"sliding_window": 4096, "logits_soft_cap": 50.0}
    cases = [
        # (label, dtype, num_seqs, num_tokens, max_query_len, kv_heads, group, head_dim, bs, splits,
        #  options)
        ("decode", torch.float16, 8, 8, 1, 8, 1, 128, 16, 1),
        ("decode", torch.bfloat16, 8, 8, 1, 8, 4, 128, 16, 1),
        ("decode", torch.bfloat16, 8, 8, 1, 2, 7, 64, 1, 1),
        ("decode split", torch.bfloat16, 2, 2, 1, 8, 8, 128, 256, 8),
        ("decode", torch.float32, 8, 8, 1, 4, 2, 64, 16, 1),
        ("prefill", torch.float16, 2, 512, 256, 8, 1, 64, 16, 1),
        ("prefill", torch.bfloat16, 2, 512, 256, 8, 4, 128, 16, 1),
        ("prefill", torch.bfloat16, 2, 512, 256, 4, 2, 256, 32, 1),
        ("prefill", torch.float32, 2, 512, 256, 4, 2, 128, 16, 1),
        ("window decode", torch.bfloat16, 8, 8, 1, 8, 2, 256, 16, 1, window),
        ("window split", torch.bfloat16, 2, 2, 1, 8, 2, 256, 16, 8, window),
        ("window prefill", torch.bfloat16, 2, 512, 256, 8, 2, 256, 16, 1, window),
    ]
    for label, dtype, seqs, tokens, max_q, kvh, group, dim, bs, splits, *options in cases:
        b = _meta_paged_batch(dtype, seqs, tokens, kvh, group, dim, bs)
        qsl = torch.empty((seqs + 1,), dtype=torch.int32, device=meta)
        name = f"{label} {str(dtype)[6:]} d{dim} g{group} bs{bs}"
        launches += _record_launches(
            name,
            lambda b=b, qsl=qsl, max_q=max_q, splits=splits, options=options: paged_attention(
                b["query"],
                b["key_cache"],
                b["value_cache"],
                b["block_tables"],
                b["seq_lens"],
                qsl,
                0.1,
                max_query_len=max_q,
                num_splits=splits,
                **(options[0] if options else {}),
            ),
        )
    return launches + _fused_moe_launches() + _quantized_matmul_launches()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="80,90", help="comma-separated SM versions, e.g. 80,90")
    args = parser.parse_args(argv)
    # Compiled mode, unless the caller says otherwise; this must precede the first kernel import.
    os.environ.setdefault("TRITON_INTERPRET", "0")
    if triton_setup.is_interpreted():
        print("the kernels are interpreted in this process; run with TRITON_INTERPRET=0")
        return 2
    arches = [int(a) for a in args.arch.split(",")]
    failures = 0
    print(f"{'kernel':<44} {'launch':<38} {'sm':>3} {'regs':>5} {'stack':>5} {'smem KiB':>8}")
    for launch in standard_launches():
        kernel = launch.fn.__name__
        for arch in arches:
            try:
                r = compile_launch(launch, arch)
            except Exception as e:  # report every failure, not just the first
                failures += 1
                print(f"{kernel:<44} {launch.label:<38} {arch:>3} FAILED: {type(e).__name__}: {e}")
                continue
            limit = SHARED_LIMIT.get(arch)
            over = limit is not None and r["shared"] > limit
            failures += over
            note = "  OVER the shared-memory limit" if over else ""
            print(
                f"{kernel:<44} {launch.label:<38} {arch:>3} {r['regs']:>5} {r['stack']:>5} "
                f"{r['shared'] / 1024:>8.1f}{note}"
            )
    print("all compiled" if failures == 0 else f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
