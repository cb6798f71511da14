"""Prefix-cache hashes: naming a full block by everything that came before it.

Two requests can share a KV block only if they have the same tokens in it *and* the same tokens
in every block before it (a token's K and V depend on its whole prefix). So a full block's hash
chains its parent's hash with its own token ids:

    hash(block i) = sha256(hash(block i-1) || token ids of block i)

The hash is deterministic across processes (never Python's salted `hash()`), so a trace or a test
sees the same values every run. Only *full* blocks are hashed: a partial block is still being
written by its owner.
"""

from __future__ import annotations

import hashlib
from array import array

NONE_HASH = b"\x00" * 32  # the "parent" of a request's first block


def hash_block_tokens(parent_hash: bytes | None, token_ids: tuple[int, ...] | list[int]) -> bytes:
    """Hash of one full block, chained to its parent's hash."""
    digest = hashlib.sha256(parent_hash or NONE_HASH)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def extend_block_hashes(
    block_hashes: list[bytes], token_ids: list[int], block_size: int, num_tokens: int
) -> None:
    """Append the hashes of the full blocks among the first `num_tokens` tokens, in place.

    Cost: only the blocks not hashed yet, so a request's hashes are computed once in its life.
    """
    for i in range(len(block_hashes), num_tokens // block_size):
        parent = block_hashes[i - 1] if i > 0 else None
        block_hashes.append(
            hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        )


def short(block_hash: bytes) -> str:
    """A readable prefix of a hash, for events and the visualizer."""
    return block_hash[:6].hex()


def hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """The prefix cache's key for a block of KV cache group `group_id` (vLLM's
    `BlockHashWithGroupId`): the same tokens in two groups are two blocks of different KV.
    Group 0's key is the hash itself, so a model with one group keys its cache as before."""
    return block_hash if group_id == 0 else block_hash + group_id.to_bytes(4, "big")
