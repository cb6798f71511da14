"""Lesson 05 planted bugs: the classic kernel mistakes, in a PyTorch emulation of the kernels.

Each emulation follows a kernel program by program and loop step by loop step, so the bugs are
the ones a kernel author makes (a forgotten rescale, a mask off by one), only without the
interpreter's cost.
"""

from __future__ import annotations

import math

import torch

from nanovllm.lessons.testing import Mutant, variant

BLOCK_N = 16


def _decode(query, key_cache, value_cache, block_tables, seq_lens, scale, *, bug: str = ""):
    device = query.device
    query, key_cache, value_cache = query.cpu(), key_cache.cpu(), value_cache.cpu()
    block_tables, seq_lens = block_tables.cpu(), seq_lens.cpu()
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=torch.float32)
    for seq in range(num_seqs):
        seq_len = int(seq_lens[seq])
        for head in range(num_heads):
            kv_head = head % num_kv_heads if bug == "gqa-modulo" else head // group
            q = query[seq, head].float()
            # max, sum, weighted sum (a learner's max may start at 0)
            m = 0.0 if bug == "learner-max-starts-at-zero" else -math.inf
            total, acc = 0.0, torch.zeros(head_dim)
            for start in range(0, seq_len, BLOCK_N):
                pos = torch.arange(start, start + BLOCK_N)
                valid = pos <= seq_len if bug == "mask-off-by-one" else pos < seq_len
                pos = pos.clamp(max=block_tables.shape[1] * block_size - 1)
                block = block_tables[seq, pos // block_size].long()
                k = key_cache[block, pos % block_size, kv_head].float()  # [N, D]
                v = value_cache[block, pos % block_size, kv_head].float()
                v = torch.where(valid[:, None], v, 0.0)
                s = torch.where(valid, (k @ q) * scale, -math.inf)
                if bug == "no-max-subtraction":
                    p = torch.exp(s)
                    total, acc = total + p.sum().item(), acc + p @ v
                    continue
                m_new = max(m, s.max().item())
                p = torch.exp(s - m_new)
                alpha = math.exp(m - m_new)
                total = (total if bug == "sum-not-rescaled" else total * alpha) + p.sum().item()
                acc = (acc if bug == "acc-not-rescaled" else acc * alpha) + p @ v
                m = m_new
            out[seq, head] = acc / total
    return out.to(query.dtype).to(device)


def _store(key, value, key_cache, value_cache, slot_mapping, *, bug: str = ""):
    """Writes through views of the caches, on whatever device they are."""
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0 and bug != "writes-padding":
            continue
        if bug == "offset-off-by-one":
            slot = (slot + 1) % (key_cache.shape[0] * block_size)
        k, v = (value[t], key[t]) if bug == "k-v-swapped" else (key[t], value[t])
        key_cache.view(-1, *key_cache.shape[2:])[slot] = k  # slot -1 wraps to the last slot
        value_cache.view(-1, *value_cache.shape[2:])[slot] = v


def _decode_bug(bug: str, description: str) -> Mutant:
    return Mutant(
        bug,
        description,
        lambda ref: variant(ref, paged_decode=lambda *args: _decode(*args, bug=bug)),
    )


def _store_bug(bug: str, description: str) -> Mutant:
    return Mutant(
        bug,
        description,
        lambda ref: variant(ref, store_kvcache=lambda *args: _store(*args, bug=bug)),
    )


MUTANTS = [
    _decode_bug("acc-not-rescaled", "online softmax: the accumulator is not rescaled by alpha"),
    _decode_bug("sum-not-rescaled", "online softmax: the running sum is not rescaled by alpha"),
    _decode_bug("no-max-subtraction", "exp(score) without subtracting the running maximum"),
    _decode_bug("mask-off-by-one", "loads are masked with pos <= seq_len: one stale slot leaks in"),
    _decode_bug("gqa-modulo", "query head h reads KV head h % num_kv_heads"),
    _store_bug("writes-padding", "a padding token (slot -1) is written, to the last slot"),
    _store_bug("k-v-swapped", "the key is written to the value cache and vice versa"),
    _store_bug("offset-off-by-one", "each token is written one slot too far"),
    # Learner mistakes: wrong solutions written as a learner writes them (issue #52).
    _decode_bug(
        "learner-max-starts-at-zero",
        "online softmax: the running maximum starts at 0, not -inf (NaN when all scores < -103)",
    ),
]
