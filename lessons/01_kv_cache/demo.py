"""Lesson 01 demo: the same text generated twice, recomputing everything vs with a KV cache.

A toy one-layer attention model (random weights, no training: we only count work) generates 96
tokens greedily. Without a cache, step n pushes all n tokens through the layer; with one, step n
pushes only the new token and attends over cached keys and values. Both must write the *same*
tokens. Then: what the cache costs in memory, for the demo model and for real ones.

Run it: `nanovllm lesson 1 --demo` (or `python demo.py`).
"""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

VOCAB, DIM, HEADS, MAX_LEN = 64, 32, 4, 128
HEAD_DIM = DIM // HEADS


class ToyModel:
    """Embedding + one attention layer + output projection. Enough to need a KV cache."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(VOCAB, DIM, generator=g)
        self.pos = torch.randn(MAX_LEN, DIM, generator=g)  # learned-style position embeddings
        self.wq, self.wk, self.wv = (torch.randn(DIM, DIM, generator=g) / DIM**0.5 for _ in "qkv")
        self.out = torch.randn(DIM, VOCAB, generator=g)
        self.tokens_processed = 0  # how many token rows went through the projections

    def qkv(self, tokens: list[int], start: int) -> tuple[torch.Tensor, ...]:
        """q, k, v of `tokens` at positions start.. : each [n, HEADS, HEAD_DIM]."""
        self.tokens_processed += len(tokens)
        x = self.embed[tokens] + self.pos[start : start + len(tokens)]  # [n, DIM]
        return tuple(
            (x @ w).view(len(tokens), HEADS, HEAD_DIM) for w in (self.wq, self.wk, self.wv)
        )

    def logits(self, attn_out: torch.Tensor) -> torch.Tensor:
        return attn_out.reshape(-1, DIM) @ self.out  # [n, VOCAB]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last q_len positions over kv_len ([n, heads, head_dim] each)."""
    q_len, kv_len = q.shape[0], k.shape[0]
    mask = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - q_len, kv_len)[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )
    return out.transpose(0, 1)


def generate_without_cache(model: ToyModel, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        q, k, v = model.qkv(tokens, 0)  # everything, every step
        tokens.append(int(model.logits(attend(q, k, v))[-1].argmax()))
    return tokens[len(prompt) :]


def generate_with_cache(model: ToyModel, prompt: list[int], n: int) -> list[int]:
    q, k_cache, v_cache = model.qkv(prompt, 0)  # prefill: the whole prompt once
    tokens = list(prompt)
    out = attend(q, k_cache, v_cache)
    for step in range(n):
        tokens.append(int(model.logits(out)[-1].argmax()))
        if step == n - 1:
            break  # the last token is out: nothing will attend to its K/V
        q, k, v = model.qkv(tokens[-1:], len(tokens) - 1)  # decode: only the new token
        k_cache, v_cache = torch.cat([k_cache, k]), torch.cat([v_cache, v])
        out = attend(q, k_cache, v_cache)
    return tokens[len(prompt) :]


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def run(console: Console) -> None:
    torch.set_num_threads(1)
    model = ToyModel()
    prompt, n = [3, 14, 15, 9, 26, 5, 35, 8], 96

    start = time.perf_counter()
    no_cache = generate_without_cache(model, prompt, n)
    t_no_cache, work_no_cache = time.perf_counter() - start, model.tokens_processed
    model.tokens_processed = 0
    start = time.perf_counter()
    cached = generate_with_cache(model, prompt, n)
    t_cached, work_cached = time.perf_counter() - start, model.tokens_processed

    table = Table(title=f"Generating {n} tokens after an {len(prompt)}-token prompt")
    table.add_column("")
    table.add_column("no cache", justify="right")
    table.add_column("KV cache", justify="right")
    for step in (1, 2, 10, 50, n):
        table.add_row(
            f"tokens through the layer at step {step}",
            str(len(prompt) + step - 1),
            "1" if step > 1 else str(len(prompt)),
        )
    table.add_row("[bold]total token passes", f"[bold]{work_no_cache}", f"[bold]{work_cached}")
    table.add_row("wall time", f"{t_no_cache * 1e3:.0f} ms", f"{t_cached * 1e3:.0f} ms")
    console.print(table)
    same = "[green]identical[/]" if no_cache == cached else "[red]DIFFERENT (a bug!)[/]"
    console.print(f"Generated tokens: {same}. First 16: {cached[:16]}")
    console.print(
        f"Without a cache the work grows with the square of the length "
        f"({work_no_cache / work_cached:.0f}x more here); with it, linearly.\n"
    )

    mem = Table(title="What the cache costs: 2 x layers x kv_heads x head_dim x bytes per token")
    for col in ("model", "layers", "kv heads", "head dim", "dtype", "per token", "8k-token chat"):
        mem.add_column(col, justify="right" if col != "model" else "left")
    models = [
        ("Llama-2-7B (no GQA)", 32, 32, 128, "bf16", 2),
        ("Llama-3-8B (GQA 4:1)", 32, 8, 128, "bf16", 2),
        ("Llama-3-70B (GQA 8:1)", 80, 8, 128, "bf16", 2),
    ]
    try:
        from nanovllm.lessons.demo_support import default_model_ready

        if default_model_ready():
            from nanovllm.engine.setup import default_model_path

            cfg = json.loads((default_model_path() / "config.json").read_text())
            heads = cfg["num_attention_heads"]
            models.insert(
                0,
                (
                    "nanovllm default model",
                    cfg["num_hidden_layers"],
                    cfg.get("num_key_value_heads") or heads,
                    cfg.get("head_dim") or cfg["hidden_size"] // heads,
                    "fp32",
                    4,
                ),
            )
    except Exception:  # noqa: BLE001 - the table is still worth showing without it
        pass
    for name, layers, kv_heads, head_dim, dtype, nbytes in models:
        per_token = kv_bytes_per_token(layers, kv_heads, head_dim, nbytes)
        mem.add_row(
            name,
            str(layers),
            str(kv_heads),
            str(head_dim),
            dtype,
            _size(per_token),
            _size(per_token * 8192),
        )
    console.print(mem)
    console.print(
        "A server holds many such conversations at once. Lesson 02: how to lay that memory out "
        "so that none of it is wasted."
    )


if __name__ == "__main__":
    run(Console())
