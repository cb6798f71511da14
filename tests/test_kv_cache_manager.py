"""The KV cache manager as a state machine: random allocate / grow / share / free / evict.

hypothesis drives a `KVCacheManager` through random operations and, after every one, checks the
invariants against an independent model of what must be true:

- every block is either in the free queue exactly once (ref count 0) or referenced;
- each block's ref count equals the number of block tables holding it;
- free + used == num_kv_blocks;
- a cached block's hash matches its tokens (recomputed from scratch here);
- a cache hit returns blocks holding exactly the request's tokens;
- after all requests are freed, every block is free.
"""

from __future__ import annotations

from collections import Counter

import pytest
from budget import examples, steps
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nanovllm.core.block_hash import hash_block_tokens
from nanovllm.core.extra_tokens import free_slots_from
from nanovllm.core.free_block_queue import FreeBlockQueue, KVCacheBlock
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.kv_cache_usage import num_filled_slots
from nanovllm.events import BlockAllocated, BlockEvicted, BlockFreed, CacheHit, EventBus
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams

# A tiny alphabet makes shared prefixes (and so cache hits) common.
tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=24)


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=100), arrival_index=0)


class KVCacheMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(1, 12),
        block_size=st.sampled_from([1, 2, 3, 4]),
        prefix_caching=st.booleans(),
    )
    def setup(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        self.events: list = []
        bus = EventBus()
        bus.subscribe(self.events.append)
        self.kv = KVCacheManager(num_blocks, block_size, prefix_caching, bus)
        self.live: dict[str, Request] = {}
        self.counter = 0
        # The free queue order, rebuilt from events alone (what the visualizer does).
        self.queue_from_events = list(range(num_blocks))

    def _consume_events(self) -> None:
        for ev in self.events:
            if isinstance(ev, BlockAllocated):
                assert self.queue_from_events[0] == ev.block_id, "allocation must take the head"
                self.queue_from_events.pop(0)
            elif isinstance(ev, CacheHit) and ev.was_free:
                self.queue_from_events.remove(ev.block_id)
            elif isinstance(ev, BlockFreed) and ev.ref_count == 0:
                self.queue_from_events.append(ev.block_id)
            elif isinstance(ev, BlockEvicted):
                assert ev.block_id == self.queue_from_events[0]
        self.events.clear()

    @rule(tokens=tokens_st)
    def admit(self, tokens: list[int]) -> None:
        """A new request: look up cached prefix blocks, then allocate its prompt."""
        self.counter += 1
        req = make_request(f"r{self.counter}", tokens)
        computed, num_cached = self.kv.get_computed_blocks(req)
        bs = self.kv.block_size
        assert len(computed.blocks) == 1, "one list per KV cache group"
        assert num_cached == len(computed.blocks[0]) * bs
        assert num_cached < len(tokens), "at least one token is always computed"
        for i, block in enumerate(computed.blocks[0]):  # hits hold exactly our tokens
            assert block.token_ids == tuple(tokens[i * bs : (i + 1) * bs])
        used_before = self.kv.num_used_blocks
        new = self.kv.allocate_slots(req, len(tokens) - num_cached, computed)
        if new is None:
            assert self.kv.num_used_blocks == used_before, "a failed allocation changes nothing"
            assert req.request_id not in self.kv.req_to_blocks
            return
        req.num_computed_tokens = len(tokens)
        assert len(self.kv.req_to_blocks[req.request_id]) == -(-len(tokens) // bs)
        self.live[req.request_id] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 5), lookahead=st.sampled_from([0, 0, 2]))
    def grow(self, data, n: int, lookahead: int) -> None:
        """A running request decodes n more tokens (a new block only when the last is full),
        perhaps with `lookahead` slots reserved past them (a draft model's, never cached)."""
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live[rid]
        blocks_before = len(self.kv.req_to_blocks[rid])
        new_tokens = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        for t in new_tokens:
            req.append_output_token(t)
        new = self.kv.allocate_slots(req, n, num_lookahead_tokens=lookahead)
        if new is None:
            for _ in range(n):
                req.output_token_ids.pop()
                req.all_token_ids.pop()
            return
        req.num_computed_tokens += n
        need = -(-(req.num_computed_tokens + lookahead) // self.kv.block_size)
        assert len(self.kv.req_to_blocks[rid]) == max(need, blocks_before)
        assert len(new.blocks[0]) == max(need - blocks_before, 0)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.kv.free(self.live.pop(rid))

    @invariant()
    def invariants(self) -> None:
        if not hasattr(self, "kv"):
            return
        kv = self.kv
        free = kv.free_block_queue.get_all_free_blocks()
        free_ids = [b.block_id for b in free]
        assert len(free_ids) == len(set(free_ids)), "a block is in the free queue twice"
        assert len(free_ids) == kv.num_free_blocks
        holders = Counter(b.block_id for blocks in kv.req_to_blocks.values() for b in blocks)
        for block in kv.blocks:
            assert block.ref_cnt == holders[block.block_id], "ref count != block tables holding it"
            assert (block.ref_cnt == 0) == (block.block_id in set(free_ids))
        assert kv.num_free_blocks + kv.num_used_blocks == kv.num_blocks
        # Every cached block's hash is the chained hash of its tokens (recomputed here).
        for block_hash, block in kv.cached_block_hash_to_block.items():
            assert block.block_hash == block_hash
        for rid, blocks in kv.req_to_blocks.items():
            assert kv.block_tables(rid)[0] == tuple(b.block_id for b in blocks), "a stale table"
            req = self.live[rid]
            parent = None
            for i, block in enumerate(blocks):
                tokens = tuple(req.all_token_ids[i * kv.block_size : (i + 1) * kv.block_size])
                expected = (
                    hash_block_tokens(parent, tokens) if len(tokens) == kv.block_size else None
                )
                if block.block_hash is not None:
                    assert block.block_hash == expected and block.token_ids == tokens
                parent = expected
        assert kv.block_pool.num_cached_free_blocks == sum(
            1 for b in free if b.block_hash is not None
        )
        filled = sum(
            min(r.num_computed_tokens, len(kv.req_to_blocks[rid]) * kv.block_size)
            for rid, r in self.live.items()
        )
        shared = sum(max(b.ref_cnt - 1, 0) for b in kv.blocks)
        assert num_filled_slots(kv) == filled - shared * kv.block_size
        self._consume_events()
        assert self.queue_from_events == free_ids, "events must rebuild the free queue order"

    def teardown(self) -> None:
        if not hasattr(self, "kv"):
            return
        for req in list(self.live.values()):
            self.kv.free(req)
        assert self.kv.num_free_blocks == self.kv.num_blocks, "a block leaked"


KVCacheMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=steps(30), deadline=None
)
TestKVCacheManager = pytest.mark.quick(KVCacheMachine.TestCase)


def test_free_block_queue_is_lru_and_o1_removable() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert q.popleft().block_id == 0
    q.remove(blocks[3])  # from the middle
    assert [b.block_id for b in q.get_all_free_blocks()] == [1, 2, 4]
    q.append(blocks[0])
    q.append(blocks[3])
    assert [b.block_id for b in q.get_all_free_blocks()] == [1, 2, 4, 0, 3]
    with pytest.raises(ValueError):
        q.append(blocks[3])  # already there: a double free is caught


def test_freed_request_is_evicted_tail_first() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    req = make_request("a", [1, 2, 3, 4, 5, 6])
    assert kv.allocate_slots(req, 6) is not None
    table = kv.get_block_table("a")
    kv.free(req)
    # The last block of the request is returned first, so it is evicted before its prefix.
    free_order = [b.block_id for b in kv.free_block_queue.get_all_free_blocks()]
    assert free_order[-3:] == list(reversed(table))


@given(st.lists(st.integers(0, 50), min_size=1, max_size=40), st.sampled_from([1, 2, 4, 8]))
def test_prefix_hit_after_free_reuses_the_same_blocks(tokens: list[int], block_size: int) -> None:
    """A freed request's full blocks stay cached: the same prompt later hits all of them."""
    kv = KVCacheManager(num_blocks=64, block_size=block_size, enable_prefix_caching=True)
    first = make_request("a", tokens)
    kv.allocate_slots(first, len(tokens))
    table = kv.get_block_table("a")
    kv.free(first)
    second = make_request("b", tokens)
    computed, num_cached = kv.get_computed_blocks(second)
    assert num_cached == ((len(tokens) - 1) // block_size) * block_size
    assert computed.get_block_ids() == (table[: len(computed.blocks[0])],)


def test_block_tables_are_one_tuple_until_the_table_changes() -> None:
    """The scheduler's per-step read of a table: the same object while no block is added or
    given back (the persistent batch checks that identity), a new one after each change."""
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    req = make_request("a", [1, 2, 3])
    assert kv.block_tables("a") == ((),) and "a" not in kv.req_to_block_ids  # unknown: nothing kept
    kv.allocate_slots(req, 3)
    first = kv.block_tables("a")[0]
    assert first == tuple(b.block_id for b in kv.req_to_blocks["a"]) and len(first) == 2
    req.num_computed_tokens = 3
    req.append_output_token(4)
    kv.allocate_slots(req, 1)  # fits the second block: no change
    assert kv.block_tables("a")[0] is first
    req.num_computed_tokens = 4
    kv.allocate_slots(req, 1, num_lookahead_tokens=1)  # a third block (for a proposal)
    grown = kv.block_tables("a")[0]
    assert len(grown) == 3 and grown[:2] == first
    free_slots_from(kv, req, 4)  # proposals rejected: the third block goes back
    assert kv.block_tables("a")[0] == first
    assert kv.get_block_table("a") == list(first)
    kv.free(req)
    assert kv.block_tables("a") == ((),) and kv.get_block_table("a") == []


def test_hash_collision_is_caught_by_comparing_tokens() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    a = make_request("a", [1, 2, 3])
    kv.allocate_slots(a, 3)
    block = kv.req_to_blocks["a"][0]
    block.token_ids = (9, 9)  # simulate a collision: same hash, other tokens
    computed, num_cached = kv.get_computed_blocks(make_request("b", [1, 2, 3]))
    assert computed.blocks == ([],) and num_cached == 0
