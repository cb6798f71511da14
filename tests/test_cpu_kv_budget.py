"""The KV cache's budget on a CPU (`executor/memory.py`): a share of the available memory, with a
ceiling, unless `kv_cache_memory_bytes` says otherwise; and the flag that sets it."""

from __future__ import annotations

import argparse

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.config import EngineConfig
from nanovllm.engine.generate_cli import add_engine_arguments, engine_options
from nanovllm.executor.memory import (
    CPU_KV_CACHE_CAP,
    CPU_KV_CACHE_FRACTION,
    available_cpu_memory,
    cpu_kv_cache_budget,
)

MEMORY = st.integers(min_value=0, max_value=2**44)  # up to 16 TiB


@settings(max_examples=examples(60))
@given(available=MEMORY)
def test_the_default_never_exceeds_the_fraction_or_the_cap(available: int) -> None:
    budget = cpu_kv_cache_budget(available)
    assert 0 <= budget <= CPU_KV_CACHE_CAP
    assert budget <= available * CPU_KV_CACHE_FRACTION
    # ...and takes all of whichever is smaller (to the byte, the fraction rounded down).
    assert budget >= min(available * CPU_KV_CACHE_FRACTION - 1, CPU_KV_CACHE_CAP)


@settings(max_examples=examples(30))
@given(available=MEMORY, override=st.integers(min_value=1, max_value=2**44))
def test_kv_cache_memory_bytes_wins(available: int, override: int) -> None:
    assert cpu_kv_cache_budget(available, override) == override


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2G", True])
def test_a_bad_kv_cache_memory_bytes_is_named(bad) -> None:
    with pytest.raises(ValueError, match=f"kv_cache_memory_bytes.*{bad!r}"):
        cpu_kv_cache_budget(2**30, bad)
    with pytest.raises(ValueError, match=f"kv_cache_memory_bytes.*{bad!r}"):
        EngineConfig(kv_cache_memory_bytes=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, None])
def test_a_bad_available_memory_is_named(bad) -> None:
    with pytest.raises(ValueError, match=f"available memory.*{bad!r}"):
        cpu_kv_cache_budget(bad)


def test_available_memory_is_a_positive_count_of_bytes() -> None:
    available = available_cpu_memory()
    assert isinstance(available, int) and available > 0


def test_the_flag_reaches_the_engine_config() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    options = engine_options(parser.parse_args(["--kv-cache-memory-bytes", "123456789"]))
    assert EngineConfig(**options).kv_cache_memory_bytes == 123456789
    assert engine_options(parser.parse_args([]))["kv_cache_memory_bytes"] is None
