"""Lesson 08 planted bugs: weak hashes and a lookup that overreaches."""

from __future__ import annotations

import hashlib

from nanovllm.lessons.testing import Mutant, variant


def _hash(parent, token_ids, *, chained=True, ordered=True):
    digest = hashlib.sha256((parent or b"root") if chained else b"root")
    for t in token_ids if ordered else sorted(token_ids):
        digest.update(int(t).to_bytes(8, "little", signed=True))
    return digest.digest()


def _hashes(hash_fn, token_ids, block_size, *, partial=False):
    out, parent = [], None
    n = -(-len(token_ids) // block_size) if partial else len(token_ids) // block_size
    for i in range(n):
        parent = hash_fn(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out


def _lookup(token_ids, block_size, cache, *, cap=True, stop_at_miss=True):
    found = []
    limit = (len(token_ids) - 1) // block_size if cap else len(token_ids) // block_size
    for h in _hashes(_hash, list(token_ids), block_size)[:limit]:
        if h not in cache:
            if stop_at_miss:
                break
            continue
        found.append(cache[h])
    return found


def _hash_variant(reference, **kw):
    def fn(parent, tokens):
        return _hash(parent, tokens, **kw)

    return variant(
        reference,
        hash_block_tokens=fn,
        block_hashes=lambda t, bs: _hashes(fn, list(t), bs),
        cached_prefix=lambda t, bs, c: _lookup_with(fn, list(t), bs, c),
    )


def _lookup_with(hash_fn, token_ids, block_size, cache):
    found = []
    for h in _hashes(hash_fn, token_ids, block_size)[: (len(token_ids) - 1) // block_size]:
        if h not in cache:
            break
        found.append(cache[h])
    return found


def _lookup_variant(reference, **kw):
    return variant(
        reference,
        hash_block_tokens=_hash,
        block_hashes=lambda t, bs: _hashes(_hash, list(t), bs),
        cached_prefix=lambda t, bs, c: _lookup(t, bs, c, **kw),
    )


MUTANTS = [
    Mutant(
        "unchained",
        "a block's hash ignores its parent: equal blocks after different prefixes collide",
        lambda ref: _hash_variant(ref, chained=False),
    ),
    Mutant(
        "order-insensitive",
        "a block's tokens are hashed as a sorted multiset",
        lambda ref: _hash_variant(ref, ordered=False),
    ),
    Mutant(
        "hashes-partial-block",
        "block_hashes also hashes the trailing partial block",
        lambda ref: variant(
            ref,
            block_hashes=lambda t, bs: _hashes(ref.hash_block_tokens, list(t), bs, partial=True),
        ),
    ),
    Mutant(
        "no-token-left",
        "the lookup may reuse every block, leaving no token to compute",
        lambda ref: _lookup_variant(ref, cap=False),
    ),
    Mutant(
        "skips-misses",
        "the lookup carries on after a miss, reusing blocks behind a gap",
        lambda ref: _lookup_variant(ref, stop_at_miss=False),
    ),
]
