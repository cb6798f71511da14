"""Hypothesis strategies and small oracles shared by several lessons' properties.

Tensors are not drawn element by element (slow, and it teaches hypothesis nothing useful about
attention); instead hypothesis draws their *shape* and a *seed*, and `randn` makes the values.
Shrinking then works on the shape, which is what a learner wants to see: the smallest sequence
length, block size or head count that still breaks their code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property

import torch
from hypothesis import strategies as st

seeds = st.integers(min_value=0, max_value=2**31 - 1)


def randn(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A deterministic standard-normal tensor of `shape`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)


def causal_attention_oracle(
    q: torch.Tensor,  # [q_len, num_heads, head_dim]
    k: torch.Tensor,  # [kv_len, num_kv_heads, head_dim]
    v: torch.Tensor,  # [kv_len, num_kv_heads, head_dim]
    scale: float,
) -> torch.Tensor:  # [q_len, num_heads, head_dim], float64
    """Attention of the last q_len positions over kv_len, in float64, the textbook way: query head
    h reads kv head h // (num_heads // num_kv_heads); query i (at position kv_len - q_len + i)
    sees keys 0 through its own position."""
    q_len, num_heads, _ = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.double().repeat_interleave(group, dim=1)  # [kv_len, num_heads, head_dim]
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale  # [num_heads, q_len, kv_len]
    q_pos = torch.arange(kv_len - q_len, kv_len)
    allowed = torch.arange(kv_len)[None, :] <= q_pos[:, None]  # [q_len, kv_len]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def scattered_table(seed: int, num_blocks: int, pool_size: int) -> list[int]:
    """`num_blocks` distinct physical block ids out of `pool_size`, in a random order: what a
    block table looks like after a while of allocating and freeing. (Drawn from a seed rather
    than with `st.permutations`: many times cheaper for hypothesis to generate.)"""
    return random.Random(seed).sample(range(pool_size), num_blocks)


def scatter_into_pool(
    k: torch.Tensor,  # [seq_len, num_kv_heads, head_dim]
    v: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], written
    value_cache: torch.Tensor,
    block_table: list[int],
) -> None:
    """Write a contiguous sequence's K/V into the pool through its block table (the slow, plain
    way: position by position), as `store_kv` would have over the sequence's lifetime."""
    block_size = key_cache.shape[1]
    for pos in range(k.shape[0]):
        block, offset = block_table[pos // block_size], pos % block_size
        key_cache[block, offset] = k[pos]
        value_cache[block, offset] = v[pos]


head_layouts = st.sampled_from([(1, 1), (2, 2), (2, 1), (4, 2), (4, 1), (6, 3)])
"""(num_heads, num_kv_heads): plain multi-head attention and GQA with groups of 2, 3 and 4."""


@dataclass(frozen=True)
class PagedCase:
    """One decoding sequence scattered over a pool of KV blocks.

    Only the numbers that define the case are fields (so a failing example prints in one line);
    the tensors are made from them on demand. The pool's other slots hold large random values,
    the stale K/V of earlier owners: any read past the sequence dominates the softmax.
    """

    block_size: int
    seq_len: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_table: tuple[int, ...]  # may be longer than needed (padded), as the engine's are
    pool_size: int
    seed: int
    scaling: float = 1.0  # the attention scale, as a multiple of the usual head_dim ** -0.5

    @property
    def scale(self) -> float:
        return self.scaling * self.head_dim**-0.5

    @cached_property
    def k(self) -> torch.Tensor:  # [seq_len, num_kv_heads, head_dim]: the contiguous keys
        return randn(self.seed, self.seq_len, self.num_kv_heads, self.head_dim)

    @cached_property
    def v(self) -> torch.Tensor:
        return randn(self.seed + 1, self.seq_len, self.num_kv_heads, self.head_dim)

    @cached_property
    def query(self) -> torch.Tensor:  # [num_heads, head_dim]: the decode token's query
        return randn(self.seed + 2, self.num_heads, self.head_dim)

    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh (key_cache, value_cache) with the sequence written through its block table."""
        shape = (self.pool_size, self.block_size, self.num_kv_heads, self.head_dim)
        key_cache = randn(self.seed + 3, *shape) * 100
        value_cache = randn(self.seed + 4, *shape) * 100
        scatter_into_pool(self.k, self.v, key_cache, value_cache, list(self.block_table))
        return key_cache, value_cache


@st.composite
def paged_sequence(
    draw, max_len: int = 40, block_sizes=(1, 2, 4, 8), head_dims=(8, 16)
) -> PagedCase:
    block_size = draw(st.sampled_from(block_sizes), label="block_size")
    seq_len = draw(st.integers(1, max_len), label="seq_len")
    num_heads, num_kv_heads = draw(head_layouts, label="(num_heads, num_kv_heads)")
    head_dim = draw(st.sampled_from(head_dims), label="head_dim")
    seed = draw(seeds, label="seed")
    num_blocks = -(-seq_len // block_size)
    pool = num_blocks + draw(st.integers(0, 3), label="spare blocks")
    table = scattered_table(seed, num_blocks, pool)
    padding = draw(st.integers(0, 2), label="padding entries")
    # Not always head_dim ** -0.5: code that ignores the scale it is given must show.
    scaling = draw(st.sampled_from([1.0, 1.0, 0.25, 3.0]), label="scale / head_dim ** -0.5")
    return PagedCase(
        block_size,
        seq_len,
        num_heads,
        num_kv_heads,
        head_dim,
        tuple(table + [table[0]] * padding),
        pool,
        seed,
        scaling,
    )


# --- scheduler states (lessons 06, 07, 09) --------------------------------------------------


@dataclass(frozen=True)
class SchedState:
    """A scheduler's situation between two steps, as plain numbers (a failing example prints
    compactly); `build()` makes fresh `Req` lists from it, since a scheduler mutates them.

    running: (prompt_len, num_output, num_computed) per admitted request, oldest first
    waiting: (prompt_len, num_output) per queued request, first come first; a request with
             output is one that was preempted and must recompute everything
    """

    running: tuple[tuple[int, int, int], ...]
    waiting: tuple[tuple[int, int], ...]
    max_num_seqs: int
    token_budget: int
    num_blocks: int | None = None  # None: memory is plentiful
    block_size: int = 4

    def lesson_rows(self, name: str) -> list[tuple[str, str]]:
        """The state as a failure report shows it: each request by the id `build` gives it,
        its numbers named."""
        rows = []
        for i, (p, o, c) in enumerate(self.running):
            rows.append(
                (
                    f"{name}.running[{i}]",
                    f"r{i}: prompt {p}, output {o}, computed {c} ({p + o - c} left to compute)",
                )
            )
        for i, (p, o) in enumerate(self.waiting):
            again = ", preempted: recomputes all" if o else ""
            rows.append((f"{name}.waiting[{i}]", f"w{i}: prompt {p}, output {o}{again}"))
        if not self.running:
            rows.append((f"{name}.running", "none"))
        if not self.waiting:
            rows.append((f"{name}.waiting", "none"))
        rows.append((f"{name}.max_num_seqs", repr(self.max_num_seqs)))
        rows.append((f"{name}.token_budget", repr(self.token_budget)))
        if self.num_blocks is not None:
            rows.append((f"{name}.num_blocks", repr(self.num_blocks)))
            rows.append((f"{name}.block_size", repr(self.block_size)))
        return rows

    def build(self) -> tuple[list, list]:
        from nanovllm.lessons.sim import Req

        running = [
            Req(f"r{i}", p, max_output=10**6, num_output=o, num_computed=c)
            for i, (p, o, c) in enumerate(self.running)
        ]
        waiting = [
            Req(f"w{i}", p, max_output=10**6, num_output=o) for i, (p, o) in enumerate(self.waiting)
        ]
        return running, waiting


@st.composite
def sched_states(
    draw,
    *,
    max_prompt: int = 40,
    decoding_only: bool = False,
    memory: bool = False,
    max_budget: int = 64,
) -> SchedState:
    """A valid state: at most max_num_seqs running, each with 1+ tokens left to compute; with
    `memory`, a pool just big enough for the running requests' blocks plus a few spare."""
    max_num_seqs = draw(st.integers(1, 6), label="max_num_seqs")
    running = []
    for _ in range(draw(st.integers(0, max_num_seqs), label="num_running")):
        prompt = draw(st.integers(1, max_prompt))
        output = draw(st.integers(0, 4))
        total = prompt + output
        remaining = 1 if decoding_only else draw(st.one_of(st.just(1), st.integers(1, total)))
        running.append((prompt, output, total - remaining))
    waiting = tuple(
        (draw(st.integers(1, max_prompt)), draw(st.sampled_from([0, 0, 0, 2])))
        for _ in range(draw(st.integers(0, 5), label="num_waiting"))
    )
    # Each request's work this step, in the order a scheduler meets them: a running one's
    # tokens left to compute, a waiting one's whole prompt (and output, if preempted).
    work = [p + o - c for p, o, c in running] + [p + o for p, o in waiting]
    budget = _near_a_boundary(draw, work, st.integers(1, max_budget), "token_budget", low=1)
    if not memory:
        return SchedState(tuple(running), waiting, max_num_seqs, budget)
    block_size = draw(st.sampled_from([1, 2, 4, 8]), label="block_size")
    held = sum(-(-c // block_size) for _, _, c in running)
    # The blocks each request takes this step as far as the budget reaches (nobody preempted;
    # the last prompt reached perhaps only a chunk of it: memory for a wrongly chunked one too).
    blocks, left = [], budget
    for (_, _, c), n in zip(running, work):
        n = min(n, left)
        blocks.append(-(-(c + n) // block_size) - -(-c // block_size))
        left -= n
    for n in work[len(running) :]:
        if left == 0:
            break
        blocks.append(-(-min(n, left) // block_size))
        left -= min(n, left)
    spare = _near_a_boundary(draw, blocks, st.integers(0, 6), "spare blocks", low=0, last=True)
    return SchedState(
        tuple(running), waiting, max_num_seqs, budget, max(held + spare, 1), block_size
    )


def _near_a_boundary(
    draw, amounts: list[int], anywhere, label: str, *, low: int, last: bool = False
) -> int:
    """A limit (a token budget, free blocks) drawn from `anywhere`, or, half the time, one that
    ends at the boundary between two requests' `amounts` (in order), or one either side: where
    the limit runs out exactly, or leaves exactly 1, so that `>` and `>=`, `> 0` and `> 1`,
    `-=` and `=` decide differently. `last`: the last boundary (all of them fit) half of
    those times."""
    ends = [sum(amounts[: j + 1]) for j in range(len(amounts))]
    if not ends or not draw(st.booleans(), label=f"{label} at a boundary"):
        return draw(anywhere, label=label)
    where = st.one_of(st.just(ends[-1]), st.sampled_from(ends)) if last else st.sampled_from(ends)
    end = draw(where, label=f"{label}: boundary")
    return max(low, end + draw(st.integers(-1, 1), label=f"{label}: off by"))


# --- a toy tokenizer (lesson 10) ------------------------------------------------------------


class ToyTokenizer:
    """A byte-level tokenizer small enough to reason about, with the two habits of real ones
    that make streaming text hard:

    - some tokens are single bytes of a multi-byte UTF-8 character ("é" is two tokens), so a
      prefix of the tokens may end in half a character, which decodes to U+FFFD;
    - like SentencePiece tokenizers, `decode` drops one leading space, so the text of a token
      depends on whether it starts the decoded span (" cat" alone decodes to "cat").

    `calls` records the length of every `decode` call, to measure how much work streaming does.
    """

    PIECES: tuple[bytes, ...] = (
        b" the",
        b" cat",
        b" sat",
        b" on",
        b" mat",
        b"s",
        b"ing",
        b".",
        b"!",
        b"\n",
        b"a",
        b"b",
        b" ",
        b"caf",
        "é".encode(),
        "☕".encode(),
        "€".encode(),
        b"\xc3",
        b"\xa9",  # "é" in two tokens
        b"\xe2",
        b"\x98",
        b"\x95",  # "☕" in three
        b"\xf0\x9f",
        b"\x98\x80",  # "😀" in two
    )

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, text: str) -> list[int]:
        """Greedy longest-match encoding (enough for the demo; every byte has a token)."""
        data, ids = text.encode(), []
        single = {p: i for i, p in enumerate(self.PIECES)}
        while data:
            for size in range(min(len(data), 4), 0, -1):
                if data[:size] in single:
                    ids.append(single[data[:size]])
                    data = data[size:]
                    break
            else:
                raise ValueError(f"no token for {data[:1]!r}")
        return ids

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        self.calls.append(len(token_ids))
        text = b"".join(self.PIECES[t] for t in token_ids).decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text


toy_token_ids = st.lists(st.integers(0, len(ToyTokenizer.PIECES) - 1), max_size=30)
