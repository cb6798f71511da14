"""The block pool on its own: random takes, frees, hits and cache registrations.

After every operation the pool must agree with an independent model kept here: which blocks
each holder has (so each block's reference count), which hash each block is registered under,
which blocks are free in LRU order (freed last = used last), and the step's evictions as data.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanovllm.core.block_pool import BlockPool

ops = st.lists(
    st.tuples(st.sampled_from(["take", "free", "cache", "hit", "step"]), st.integers(0, 7)),
    max_size=60,
)


@settings(deadline=None)
@given(ops=ops)
@example(ops=[("take", 0), ("cache", 1), ("free", 0), ("hit", 1)])  # a hit on a free block
@example(ops=[("take", 0), ("cache", 1), ("free", 0)] + [("take", 0)] * 6 + [("step", 0)])
def test_the_pool_matches_a_model_of_it(ops) -> None:
    pool = BlockPool(6)
    held: list[int] = []  # block ids held, one entry per reference
    free_order = list(range(6))  # the model's free queue, LRU first
    cached: dict[int, bytes] = {}  # block id -> its hash
    evicted: list[tuple[int, bytes]] = []  # this step's evictions (id, hash)
    for op, arg in ops:
        if op == "take" and free_order:
            block = pool.get_new_block()
            assert block.block_id == free_order.pop(0)  # the LRU head
            if block.block_id in cached:
                evicted.append((block.block_id, cached.pop(block.block_id)))
            held.append(block.block_id)
        elif op == "free" and held:
            block_id = held.pop(arg % len(held))
            pool.free_block(pool.blocks[block_id])
            if block_id not in held:
                free_order.append(block_id)  # the tail: used last
        elif op == "cache" and held and held[arg % len(held)] not in cached:
            # (the manager registers a block once: a block already cached is a hit)
            block_id = held[arg % len(held)]
            block_hash = bytes([arg])
            registered = pool.cache_block(pool.blocks[block_id], block_hash, (arg,))
            assert registered == (block_hash not in cached.values())  # the first one stays
            if registered:
                cached[block_id] = block_hash
        elif op == "hit":
            hit = pool.get_cached_block(bytes([arg]), (arg,))
            owner = [i for i, h in cached.items() if h == bytes([arg])]
            assert (hit.block_id if hit else None) == (owner[0] if owner else None)
            if hit is not None:
                assert pool.touch(hit) == (hit.block_id in free_order)
                if hit.block_id in free_order:
                    free_order.remove(hit.block_id)
                held.append(hit.block_id)
        elif op == "step":
            assert pool.step_evicted_blocks == evicted
            pool.begin_step()
            evicted = []
        # The invariants, against the model.
        assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == free_order
        for block in pool.blocks:
            assert block.ref_cnt == held.count(block.block_id)
            assert block.block_hash == cached.get(block.block_id)
        assert pool.cached_block_hash_to_block == {h: pool.blocks[i] for i, h in cached.items()}
        assert pool.num_cached_free_blocks == sum(1 for i in free_order if i in cached)
