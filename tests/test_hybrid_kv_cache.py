"""The hybrid KV cache manager: KV cache groups, the single-type managers, the coordinator.

Each manager's rules are checked against a plain rule written out here; the whole manager (a
full-attention group beside a sliding-window one, or a sliding group alone) as a state machine:
blocks are conserved, every held block of a sliding group is inside its request's window, every
block's ref count is the number of tables holding it, and nothing leaks once every request is
freed (finished, aborted or preempted: the manager sees a `free` in each case).
"""

from __future__ import annotations

from collections import Counter

from budget import examples, steps
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nanovllm.core.block_hash import extend_block_hashes
from nanovllm.core.block_pool import BlockPool
from nanovllm.core.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
    get_kv_cache_config,
    layer_specs,
)
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.kv_cache_usage import num_filled_slots
from nanovllm.core.single_type_kv_cache_manager import FullAttentionManager
from nanovllm.core.sliding_window_manager import SlidingWindowManager
from nanovllm.events import EventBus
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=100), arrival_index=0)


# --- grouping ----------------------------------------------------------------------------------


@settings(max_examples=examples(40), deadline=None)
@given(types=st.lists(st.sampled_from(["full_attention", "sliding_attention"]), min_size=1,
                      max_size=12))  # fmt: skip
def test_groups_share_tensors_and_cover_every_layer_once(types: list[str]) -> None:
    """Every layer is in exactly one group of its own spec; groups are no larger than the
    tensor count, and two layers of one group never share a tensor (the plain rule: tensor j is
    the j-th layer of every group)."""
    specs = layer_specs(tuple(types), 5, len(types), 4)
    config = get_kv_cache_config(specs)
    layers = [i for g in config.kv_cache_groups for i in g.layer_indices]
    assert sorted(layers) == list(range(len(types)))
    for group in config.kv_cache_groups:
        assert len(group.layer_indices) <= config.num_kv_tensors
        assert all(specs[i] == group.kv_cache_spec for i in group.layer_indices)
    tensor_of = config.layer_to_kv_tensor(len(types))
    for group in config.kv_cache_groups:
        assert len({tensor_of[i] for i in group.layer_indices}) == len(group.layer_indices)
    if len(set(types)) == 1:  # one type: one group, a tensor per layer (no sharing)
        assert config.num_groups == 1 and config.num_kv_tensors == len(types)
    # disable_hybrid_kv_cache_manager: one group of full attention, whatever the layers
    flat = get_kv_cache_config(layer_specs(tuple(types), 5, len(types), 4, True))
    assert flat.num_groups == 1 and not flat.has_sliding_window


# --- the managers' rules, against plain ones ---------------------------------------------------


def cached_pool(num_blocks: int, block_size: int, tokens: list[int], cached: set[int]):
    """A pool whose prefix cache holds `tokens`' blocks with the indices in `cached`."""
    pool = BlockPool(num_blocks, EventBus(), with_null_block=True)
    hashes: list[bytes] = []
    extend_block_hashes(hashes, tokens, block_size, len(tokens))
    for i in sorted(cached):
        block = pool.get_new_block()
        pool.cache_block(block, hashes[i], tuple(tokens[i * block_size : (i + 1) * block_size]))
        pool.free_block(block)
    return pool, hashes


@settings(max_examples=examples(60), deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 3, 4]),
    window=st.integers(1, 12),
    num_blocks=st.integers(0, 8),
    is_cached=st.lists(st.sampled_from([True, True, True, False]), min_size=8, max_size=8),
    data=st.data(),
)
def test_find_longest_cache_hit_matches_the_plain_rule(
    block_size: int, window: int, num_blocks: int, is_cached: list[bool], data
) -> None:
    """Full attention: the longest run of cached blocks from block 0. Sliding window: the
    largest L (blocks) whose last min(L, ceil((W - 1) / block_size)) blocks are all cached;
    blocks before those are the null block, the others the cached ones."""
    tokens = list(range(2, 2 + (num_blocks + 1) * block_size))
    cached = {i for i in range(num_blocks) if is_cached[i]}  # (mostly runs of cached blocks)
    pool, hashes = cached_pool(20, block_size, tokens, cached)
    max_length = data.draw(st.integers(0, num_blocks * block_size), label="max_length")
    max_blocks = max_length // block_size
    request = make_request("r", tokens)

    full = FullAttentionManager(FullAttentionSpec(block_size), pool, 0, EventBus())
    hit = full.find_longest_cache_hit(request, hashes, max_length)
    expected = 0
    while expected < max_blocks and expected in cached:
        expected += 1
    assert len(hit) == expected
    assert all(b.block_hash == hashes[i] for i, b in enumerate(hit))

    sliding = SlidingWindowManager(SlidingWindowSpec(block_size, window), pool, 0, EventBus())
    hit = sliding.find_longest_cache_hit(request, hashes, max_length)
    need = -(-(window - 1) // block_size)
    best = max(
        L for L in range(max_blocks + 1) if all(i in cached for i in range(max(L - need, 0), L))
    )
    assert len(hit) == best
    for i, block in enumerate(hit):
        if i < best - need:
            assert block is pool.null_block
        else:
            assert block.block_hash == hashes[i]


@settings(max_examples=examples(40), deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 3, 5]),
    window=st.integers(1, 20),
    grows=st.lists(st.integers(1, 9), min_size=1, max_size=8),
)
def test_remove_skipped_blocks_frees_exactly_the_blocks_behind_the_window(
    block_size: int, window: int, grows: list[int]
) -> None:
    """After `remove_skipped_blocks(n)`, block i is null exactly when it ends before the
    first token the next query sees, n - W + 1 (the plain rule), and every freed block is back
    in the free queue."""
    pool = BlockPool(64, EventBus(), with_null_block=True)
    manager = SlidingWindowManager(SlidingWindowSpec(block_size, window), pool, 0, EventBus())
    computed = 0
    for n in grows:
        manager.remove_skipped_blocks("r", computed)
        blocks = manager.req_to_blocks.get("r", [])
        first_seen = max(computed - window + 1, 0)
        for i, block in enumerate(blocks):
            behind = (i + 1) * block_size <= first_seen
            assert (block is pool.null_block) == behind, (i, computed, window)
        manager.allocate_new_blocks("r", computed + n)
        computed += n
    held = [b for b in manager.req_to_blocks["r"] if b is not pool.null_block]
    assert pool.num_free_blocks == 63 - len(held)
    manager.free("r")
    assert pool.num_free_blocks == 63


# --- the whole manager, as a state machine ------------------------------------------------------


def hybrid_config(block_size: int, window: int, with_full: bool) -> KVCacheConfig:
    groups = [KVCacheGroupSpec((0,), SlidingWindowSpec(block_size, window))]
    if with_full:
        groups.insert(0, KVCacheGroupSpec((1,), FullAttentionSpec(block_size)))
    return KVCacheConfig(tuple(groups), 1)


tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=40)  # (shared prefixes are common)


class HybridKVCacheMachine(RuleBasedStateMachine):
    """Requests admitted (with their prefix-cache hits), computed a chunk at a time, finished
    or preempted at random, against a manager with a sliding group (and maybe a full one)."""

    @initialize(
        num_blocks=st.integers(2, 40),
        block_size=st.sampled_from([1, 2, 3, 4]),
        window=st.integers(1, 12),
        with_full=st.booleans(),
        prefix_caching=st.booleans(),
    )
    def setup(self, num_blocks, block_size, window, with_full, prefix_caching) -> None:
        config = hybrid_config(block_size, window, with_full)
        self.kv = KVCacheManager(
            num_blocks, block_size, prefix_caching, EventBus(), kv_cache_config=config
        )
        self.window = window
        self.running: dict[str, Request] = {}
        self.allocated_at: dict[str, int] = {}  # tokens computed when its blocks were last sized
        self.counter = 0

    def managers(self):
        return self.kv.coordinator.single_type_managers

    @rule(tokens=tokens_st)
    def admit(self, tokens: list[int]) -> None:
        request = make_request(f"r{self.counter}", tokens)
        self.counter += 1
        hits, num_hit = self.kv.get_computed_blocks(request)
        assert num_hit < len(tokens)
        assert len(hits.blocks) == self.kv.num_groups  # (one list per group, always)
        for group_hits in hits.blocks:
            assert len(group_hits) * self.kv.block_size == num_hit
            for i, block in enumerate(group_hits):  # a real hit holds the request's tokens
                if block is not self.kv.block_pool.null_block:
                    bs = self.kv.block_size
                    assert block.token_ids == tuple(tokens[i * bs : (i + 1) * bs])
        num_new = len(tokens) - num_hit
        if self.kv.allocate_slots(request, num_new, hits) is None:
            return
        request.num_computed_tokens = len(tokens)  # computed in this step
        self.allocated_at[request.request_id] = num_hit
        self.running[request.request_id] = request

    @precondition(lambda self: self.running)
    @rule(data=st.data(), n=st.integers(1, 6))
    def decode(self, data, n: int) -> None:
        """A running request computes `n` more tokens (its own, appended as if sampled)."""
        rid = data.draw(st.sampled_from(sorted(self.running)))
        request = self.running[rid]
        computed = request.num_computed_tokens
        if self.kv.allocate_slots(request, n) is None:
            self.preempt(rid)
            return
        for _ in range(n):
            request.append_output_token(computed % 3)
        request.num_computed_tokens = computed + n
        self.allocated_at[rid] = computed

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data) -> None:
        self.preempt(data.draw(st.sampled_from(sorted(self.running))))

    def preempt(self, rid: str) -> None:
        self.kv.free(self.running.pop(rid))
        del self.allocated_at[rid]

    @invariant()
    def blocks_conserved(self) -> None:
        pool, null = self.kv.block_pool, self.kv.block_pool.null_block
        holders = Counter(
            b.block_id
            for m in self.managers()
            for table in m.req_to_blocks.values()
            for b in table
            if b is not null
        )
        for block in pool.blocks:
            if block is not null:
                assert block.ref_cnt == holders[block.block_id]
        assert pool.num_free_blocks + len(holders) + 1 == self.kv.num_blocks
        free_ids = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        assert sorted(free_ids) == sorted(
            b.block_id for b in pool.blocks if b.ref_cnt == 0 and b is not null
        )

    @invariant()
    def sliding_groups_hold_only_blocks_in_a_window(self) -> None:
        """Every block a sliding group holds for a request reaches into the window of the
        step it was last sized for: its last token is at or after n - W + 1, n the tokens
        computed then (freed blocks, cached or not, are the free queue's, not the group's)."""
        bs = self.kv.block_size
        for m in self.managers():
            if not isinstance(m, SlidingWindowManager):
                continue
            for rid, table in m.req_to_blocks.items():
                first_seen = max(self.allocated_at[rid] - self.window + 1, 0)
                for i, block in enumerate(table):
                    if (i + 1) * bs <= first_seen:
                        assert block is self.kv.block_pool.null_block, (rid, i, first_seen)

    def teardown(self) -> None:
        for rid in list(self.running):
            self.preempt(rid)
        pool = self.kv.block_pool
        assert pool.num_free_blocks == self.kv.num_blocks - 1  # all but the null block
        assert all(not m.req_to_blocks for m in self.managers())
        assert num_filled_slots(self.kv) == 0


HybridKVCacheMachine.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=steps(30), deadline=None
)
TestHybridKVCacheMachine = HybridKVCacheMachine.TestCase


def test_a_model_without_windows_has_no_null_block() -> None:
    """One group of full attention: every block usable, block 0 handed out first, as before."""
    kv = KVCacheManager(4, 2)
    assert kv.block_pool.null_block is None
    request = make_request("r", [5, 6, 7])
    assert kv.allocate_slots(request, 3).get_block_ids() == ([0, 1],)


def test_the_null_block_is_no_ones() -> None:
    """With a sliding group, block 0 is the null block: never handed out, not counted as used,
    and no obstacle to resetting the prefix cache once every request is gone."""
    kv = KVCacheManager(12, 2, kv_cache_config=hybrid_config(2, 3, with_full=True))
    request = make_request("r", list(range(2, 9)))
    assert kv.num_used_blocks == 0
    taken = kv.allocate_slots(request, 7)
    assert taken is not None and not any(0 in ids for ids in taken.get_block_ids())
    kv.free(request)
    assert kv.num_used_blocks == 0 and kv.reset_prefix_cache()
