"""Lesson 08 planted bugs: weak hashes and a lookup that overreaches."""

from __future__ import annotations

import hashlib

from nanovllm.lessons.testing import Mutant, variant


def _hash(parent, token_ids, *, chained=True, ordered=True):
    digest = hashlib.sha256((parent or b"root") if chained else b"root")
    for t in token_ids if ordered else sorted(token_ids):
        digest.update(int(t).to_bytes(8, "little", signed=True))
    return digest.digest()


def _digits_hash(parent, token_ids):
    """The tokens' decimal digits, run together: [1, 23] and [12, 3] are both "123"."""
    text = "".join(str(t) for t in token_ids)
    return hashlib.sha256((parent or b"root") + text.encode()).digest()


def _salted_hash(parent, token_ids):
    """Python's hash() of the parent and the tokens: the same in every call of one process,
    different in another (bytes are hashed with a per-process salt)."""
    salted = hash((parent, tuple(token_ids)))
    return hashlib.sha256(str(salted).encode()).digest()


def _two_byte_hash(parent, token_ids):
    """Each token in two bytes: ids past 65535 wrap, so tokens 1 and 65537 are alike."""
    digest = hashlib.sha256(parent or b"root")
    for t in token_ids:
        digest.update((int(t) & 0xFFFF).to_bytes(2, "little"))
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


def _hash_variant(reference, hash_fn=None, **kw):
    def fn(parent, tokens):
        return _hash(parent, tokens, **kw)

    fn = hash_fn or fn
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
        "digits-joined",
        "the tokens' decimal digits run together: [1, 23] and [12, 3] hash the same",
        lambda ref: _hash_variant(ref, _digits_hash),
    ),
    Mutant(
        "salted-hash",
        "built on Python's hash(), salted per process: another process hashes differently",
        lambda ref: _hash_variant(ref, _salted_hash),
    ),
    Mutant(
        "two-byte-tokens",
        "each token id in two bytes: right for small ids, ids past 65535 collide",
        lambda ref: _hash_variant(ref, _two_byte_hash),
    ),
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
