"""Lesson 08 exercise: chained block hashes and the prefix-cache lookup.

Check with `nanovllm lesson 8 --check`.
"""

from __future__ import annotations

import hashlib  # noqa: F401  (yours to use)
from collections.abc import Sequence


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """The hash of one full block: of its parent block's hash (None for a request's first
    block) and of its token ids, in order.

    It must be deterministic across processes (hashlib, never Python's salted `hash()`), and it
    must change when any token changes, when their order changes, or when the parent changes.
    Hint: `hashlib.sha256`, fed the parent hash (or a constant for None) and the token ids as
    bytes.
    """
    raise NotImplementedError("write hash_block_tokens (lesson 08)")


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hashes of the full blocks of `token_ids`: one per full block (a trailing
    partial block has none). Block i's parent is block i-1; block 0's parent is None."""
    raise NotImplementedError("write block_hashes (lesson 08)")


def cached_prefix(token_ids: Sequence[int], block_size: int, cache: dict[bytes, int]) -> list[int]:
    """The physical block ids a new request of `token_ids` can reuse from the prefix cache.

    `cache` maps a block hash to the id of the block holding those K/V. Walk the request's block
    hashes from the first; collect `cache[hash]` until the first hash not in the cache. Reuse at
    most `(len(token_ids) - 1) // block_size` blocks: at least one token is always left to
    compute.
    """
    raise NotImplementedError("write cached_prefix (lesson 08)")
