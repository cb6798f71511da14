"""Scheduling configurations for engine property tests of speculative decoding.

Each example is the engine's keyword arguments and a number of speculative tokens k: tiny
blocks, a KV cache of 64 slots (small enough to force preemption with the tests' prompts),
token budgets that chunk prefills, one to eight sequences, prefix caching on or off.
"""

from __future__ import annotations

from hypothesis import strategies as st


def _engine_kwargs(block_size: int, kv_slots: int, **options) -> dict:
    return dict(block_size=block_size, num_kv_blocks=max(kv_slots // block_size, 1), **options)


speculative_engine_configs = st.tuples(
    st.builds(
        _engine_kwargs,
        block_size=st.sampled_from([1, 3, 4, 16]),
        kv_slots=st.sampled_from([64, 96, 4096]),  # 64 slots forces preemption
        max_num_batched_tokens=st.sampled_from([5, 17, 2048]),
        max_num_seqs=st.sampled_from([1, 3, 8]),
        enable_prefix_caching=st.booleans(),
    ),
    st.sampled_from([1, 3, 5]),  # k
)
