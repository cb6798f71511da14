"""Lesson 08 reference: the engine's block hashing and `KVCacheManager.get_computed_blocks`.

For `cached_prefix`, the lesson's `{hash: block id}` table is loaded into a fresh KV cache
manager as cached blocks, and the engine looks the request up exactly as at admission (the
manager also compares each hit's tokens, which it knows for blocks it filled itself; here they
are set from the request, since equal chained hashes mean equal prefixes).
"""

from __future__ import annotations

from collections.abc import Sequence

from nanovllm.core.block_hash import extend_block_hashes
from nanovllm.core.block_hash import hash_block_tokens as _engine_hash
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

__all__ = ["hash_block_tokens", "block_hashes", "cached_prefix"]


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    return _engine_hash(parent_hash, list(token_ids))


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    hashes: list[bytes] = []
    extend_block_hashes(hashes, list(token_ids), block_size, len(token_ids))
    return hashes


def cached_prefix(token_ids: Sequence[int], block_size: int, cache: dict[bytes, int]) -> list[int]:
    token_ids = list(token_ids)
    mine = block_hashes(token_ids, block_size)
    kv = KVCacheManager(max(cache.values(), default=0) + 1, block_size, enable_prefix_caching=True)
    for block_hash, block_id in cache.items():
        block = kv.blocks[block_id]
        block.block_hash = block_hash
        if block_hash in mine:
            i = mine.index(block_hash)
            block.token_ids = tuple(token_ids[i * block_size : (i + 1) * block_size])
        kv.cached_block_hash_to_block[block_hash] = block
    request = Request("new", token_ids, SamplingParams(), arrival_index=0)
    blocks, _ = kv.get_computed_blocks(request)
    return blocks.get_block_ids()[0]  # (one KV cache group)
