"""The worker group: calls reach every rank with their inputs; validation comes first; close is clean.

One group of 2 gloo ranks serves the module (faults, which end a group, are in test_faults.py).
It is created at its first use, so the tests that need no group (and must run while this
process is in none) come first, and the test that closes it comes last.
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from proc_utils import is_running
from rank_checks import RankChecks

from nanovllm.distributed import (
    WorkerGroup,
    WorkerGroupError,
    check_device_count,
    check_tensor_parallel_size,
    get_tp_world_size,
)


@pytest.fixture(scope="module")
def group():
    group = WorkerGroup(2, RankChecks, timeout_s=60)
    yield group
    group.close()


def test_world_size_one_starts_no_process():
    before = multiprocessing.active_children()
    with WorkerGroup(1, RankChecks) as group:
        assert group.run("whoami")[:2] == (0, 1)
        assert group.run_all("sleep", {}) == [0]
        assert group.pids == {} and multiprocessing.active_children() == before


@pytest.mark.parametrize(
    "tp, heads, kv_heads, inter, message",
    [
        (3, 4, None, None, "tensor_parallel_size=3 does not divide num_attention_heads=4"),
        (4, 12, 3, None, "tensor_parallel_size=4 and num_key_value_heads=3"),
        (2, 4, 2, 11, "tensor_parallel_size=2 does not divide intermediate_size=11"),
        (0, 4, None, None, "positive integer, got 0"),
    ],
)
def test_a_size_that_cannot_split_the_model_is_refused(tp, heads, kv_heads, inter, message):
    with pytest.raises(ValueError, match=message):
        check_tensor_parallel_size(tp, heads, kv_heads, inter)


@pytest.mark.parametrize("tp, heads, kv_heads", [(2, 4, 2), (4, 4, 2), (8, 8, 1), (1, 5, 5)])
def test_sizes_that_split_evenly_or_replicate_kv_heads_pass(tp, heads, kv_heads):
    check_tensor_parallel_size(tp, heads, kv_heads, 8 * tp)


def test_more_cuda_ranks_than_devices_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="tensor_parallel_size=3 .* only 2 CUDA devices"):
        check_device_count(3, "cuda", device_count=2)
    check_device_count(64, "cpu")  # CPU ranks share the cores
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices")
    before = multiprocessing.active_children()
    with pytest.raises(ValueError, match="tensor_parallel_size=2 .* only 0 CUDA devices"):
        WorkerGroup(2, RankChecks, device_type="cuda")
    assert multiprocessing.active_children() == before


def test_run_returns_rank0_result_and_run_all_every_rank(group):
    assert group.run("whoami")[:2] == (0, 2)
    assert [r[:2] for r in group.run_all("whoami")] == [(0, 2), (1, 2)]


def test_arguments_reach_every_rank(group):
    x = torch.arange(6.0).view(2, 3)
    for args, kwargs in group.run_all("echo", x, "text", [1, 2], ids=torch.tensor([5]), n=3):
        assert torch.equal(args[0], x) and args[1:] == ("text", [1, 2])
        assert torch.equal(kwargs["ids"], torch.tensor([5])) and kwargs["n"] == 3


def test_one_group_per_process(group):
    before = multiprocessing.active_children()
    with pytest.raises(WorkerGroupError, match="already rank 0"):
        WorkerGroup(2, RankChecks)
    assert multiprocessing.active_children() == before


def test_close_stops_every_worker_and_leaves_the_group(group):
    """Last in the module: closes the shared group."""
    pids = group.pids
    with group:
        assert group.run("sleep", {}) == 0
    assert pids and not any(is_running(pid) for pid in pids.values())
    assert get_tp_world_size() == 1
    group.close()  # a second close is harmless
    with pytest.raises(WorkerGroupError, match="closed"):
        group.run("whoami")
